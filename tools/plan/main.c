#include "hcomm/api.h"
int main(void) {
    return 0;
}
