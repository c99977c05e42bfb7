/**
 * @file api.h
 * @brief Umbrella header: includes every public hcomm header except hcomm/mpi.h (which needs
 *        <mpi.h>; include it yourself to wrap an MPI communicator).
 */
#ifndef HCOMM_C_API_H_
#define HCOMM_C_API_H_

#include "hcomm/core.h"
#include "hcomm/domain.h"
#include "hcomm/tp.h"
#include "hcomm/pp.h"
#include "hcomm/moe.h"
#include "hcomm/dp.h"
#include "hcomm/zero.h"
#include "hcomm/topo.h"
#include "hcomm/cp.h"
#include "hcomm/fault.h"
#include "hcomm/version.h"

#endif /* HCOMM_C_API_H_ */
