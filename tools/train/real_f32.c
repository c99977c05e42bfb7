/* hcomm-train's compute code in f32 (--dtype f32, and bf16 with rounding); see real/real.h. */
#define TRAIN_REAL_F32 1
#include "real/comm.c"
#include "real/model.c"
#include "real/nn.c"
#include "real/attn.c"
#include "real/sp.c"
#include "real/train.c"
