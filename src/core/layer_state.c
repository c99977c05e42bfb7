/* The state each layer keeps on a communicator, created on first use (internal.h). */
#include "core/internal.h"

void *hcomm__layer_state(void **slot, void (**slot_free)(void *), size_t size,
                         void *(*alloc)(size_t, size_t), void (*free_fn)(void *)) {
    if (!*slot) {
        *slot = alloc(1, size);
        *slot_free = free_fn;
    }
    return *slot;
}
