/* hcomm-doctor DIR [--json]: the verdict on a hang from the flight recorders every rank wrote
 * into HCOMM_DUMP_DIR: which ranks wait in which call, which rank has not reached it, called
 * something else or differs in its arguments, and the peer the waiters waited on. */
#include "doctor.h"

#include <string.h>

static int usage(void) {
    fprintf(stderr, "usage: hcomm-doctor DIR [--json]\n"
                    "  DIR: the HCOMM_DUMP_DIR of a job whose ranks failed with a timeout,\n"
                    "  an abort or a mismatch (hcomm-rank<W>.json per rank)\n");
    return 2;
}

int main(int argc, char **argv) {
    const char *dir = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (argv[i][0] == '-' || dir)
            return usage();
        else
            dir = argv[i];
    }
    if (!dir)
        return usage();
    doc_set_t s = {0};
    bool ok = doc_read_dir(dir, &s);
    if (ok)
        doc_verdict(stdout, &s, json);
    doc_free(&s);
    return ok ? 0 : 1;
}
