/* The unexpected-message budget (HCOMM_UNEXPECTED_BYTES): messages that arrive before their
 * receive are kept up to the budget; past it the waiting receive fails naming the peer and the
 * tag of the message that did not fit, nothing is dropped, and once the kept messages are
 * received everything flows again. HCOMM_TEST_MPI */
#include "harness.h"
#include "p2p/p2p.h"

#include <stdlib.h>
#include <string.h>

enum { MSGS = 8, BYTES = 1000 };

static hcomm_result_t budget(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int rank = t_rank(w);
    if (t_size(w) < 2 || rank > 1)
        return hcomm_barrier(w);
    unsigned char buf[BYTES];
    if (rank == 0) {
        for (int m = 1; m <= MSGS; m++) {
            memset(buf, m, sizeof buf);
            T_TRY(hcomm__send(w, HCOMM__CH_USER, m, 1, buf, sizeof buf, NULL));
        }
    } else {
        /* 4 of the 8 fit in 4096 bytes; the receive of tag 99 must fail on the fifth. */
        hcomm_result_t r = hcomm__recv(w, HCOMM__CH_USER, 99, 0, buf, 1, HCOMM__RECV_EXACT, NULL);
        T_EQ_INT(r, HCOMM_ERR_NOMEM);
        T_CHECK(strstr(hcomm_last_error(), "from rank 0") && strstr(hcomm_last_error(), "tag 5") &&
                    strstr(hcomm_last_error(), "HCOMM_UNEXPECTED_BYTES"),
                "budget message: '%s'", hcomm_last_error());
        for (int m = 1; m <= MSGS; m++) {
            T_TRY(hcomm__recv(w, HCOMM__CH_USER, m, 0, buf, sizeof buf, HCOMM__RECV_EXACT, NULL));
            T_CHECK(buf[0] == m && buf[BYTES - 1] == m, "message %d holds %d", m, buf[0]);
        }
        T_EQ_INT((int)hcomm__unexpected_bytes(w), 0);
    }
    return hcomm_barrier(w);
}

int main(void) {
    setenv("HCOMM_UNEXPECTED_BYTES", "4096", 1);
    setenv("HCOMM_EAGER_LIMIT", "8192", 1); /* the budget holds eager messages */
    if (strcmp(t_backend(), "mpi") == 0)
        T_OK(hcomm_launch("mpi", 0, budget, NULL));
    else
        for (int n = 2; n <= 3; n++)
            T_OK(hcomm_launch("local", n, budget, NULL));
    return t_finish("test_budget");
}
