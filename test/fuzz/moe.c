/* Call kinds: MoE top-k (moe.h); filled in below. */
#include "fuzz.h"

const fz_kind_t fz_moe_kinds[] = {{"moe_placeholder", 0, 0}};
const int fz_moe_nkinds = 0;
