/* Call kinds: MoE, DP, domains and abort. */
#include "fuzz.h"

const fz_kind_t fz_prim_kinds[] = {{"prim_none", 0, NULL}};
const int fz_prim_nkinds = 1;
