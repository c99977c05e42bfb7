/* Call kinds: pipeline-parallel point-to-point (pp.h). */
#include "fuzz.h"

const fz_kind_t fz_pp_kinds[] = {{"pp_none", 0, NULL}};
const int fz_pp_nkinds = 1;
