/* hcomm_mem_alloc objects must not outlive their process in /dev/shm (test_mem_exit.sh):
 *   mem_exit exit   allocates, prints "pid P", returns from main without hcomm_mem_free;
 *   mem_exit hang   allocates, prints "pid P", sleeps until killed;
 *   mem_exit alloc  allocates and frees (the first allocation sweeps dead owners' objects). */
#include "hcomm/api.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "exit";
    void *p = NULL;
    if (hcomm_mem_alloc(1 << 20, &p) != HCOMM_OK) {
        fprintf(stderr, "mem_exit: %s\n", hcomm_last_error());
        return 1;
    }
    memset(p, 1, 1 << 20);
    printf("pid %d\n", (int)getpid());
    fflush(stdout);
    if (strcmp(mode, "hang") == 0)
        for (;;)
            pause();
    if (strcmp(mode, "alloc") == 0)
        return hcomm_mem_free(p) == HCOMM_OK ? 0 : 1;
    return 0;
}
