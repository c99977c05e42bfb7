/* hcomm-train's compute code in f64 (--dtype f64); see real/real.h. */
#define TRAIN_REAL_F64 1
#include "real/comm.c"
#include "real/model.c"
#include "real/nn.c"
#include "real/attn.c"
#include "real/sp.c"
#include "real/train.c"
