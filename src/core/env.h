/* Settings read from the environment. Each HCOMM_* variable has one reader with its default;
 * a malformed value is an error naming the variable and its value, never a silent default. */
#ifndef HCOMM_C_ENV_H_
#define HCOMM_C_ENV_H_

#include "core/internal.h"

/* A positive number of seconds from HCOMM_TIMEOUT (default 300). fn names the caller. */
hcomm_result_t hcomm__env_timeout(const char *fn, double *seconds);
/* HCOMM_FAILURE_DETECT: the seconds within which a lost rank is noticed (default 2; 0: never
 * looked for; malformed: the default). */
double hcomm__env_failure_detect(void);
/* A byte count in lo..hi from name (suffixes K, M, G are powers of 1024), or dflt if unset. */
hcomm_result_t hcomm__env_bytes(const char *fn, const char *name, size_t dflt, size_t lo, size_t hi,
                                size_t *out);
/* HCOMM_EAGER_LIMIT: bytes up to which a message goes eager (default 8K, at most 1M). */
hcomm_result_t hcomm__env_eager_limit(const char *fn, size_t *bytes);
/* One of choices[0..n) from name (its index in *out), or dflt if unset. */
hcomm_result_t hcomm__env_choice(const char *fn, const char *name, const char *const *choices,
                                 int n, int dflt, int *out);
/* HCOMM_CHECK as 0 (always, the default), 1 (first) or 2 (off). */
enum { HCOMM__CHECK_ALWAYS, HCOMM__CHECK_FIRST, HCOMM__CHECK_OFF };
hcomm_result_t hcomm__env_check(const char *fn, int *mode);
/* This process's HCOMM_CHECK mode, read once (a malformed value counts as always:
 * hcomm_launch reports it). */
int hcomm__check_mode(void);
/* What HCOMM_CHECK's mode may explain of a mismatch or a wait that timed out, to append to the
 * message ("" under always, or where the transport compares every call anyway: compared). */
const char *hcomm__check_hint(bool compared);
/* HCOMM_DETERMINISTIC: 0 (the default) or 1, every new world's deterministic mode. */
hcomm_result_t hcomm__env_deterministic(const char *fn, bool *on);
/* HCOMM_DUMP_DIR: the directory each rank writes its flight recorder into as JSON after a
 * call fails with a timeout, abort, peer failure or mismatch (*dir NULL when unset); a value
 * that is not a directory is an error. */
hcomm_result_t hcomm__env_dump_dir(const char *fn, const char **dir);
/* The same without an error (a failed call's message stays the thread's last error): NULL when
 * unset or not a directory. */
const char *hcomm__dump_dir(void);
/* s[0..*len) without the blanks around it (its start; *len shrinks): the settings' parsers
 * (HCOMM_TOPO, HCOMM_ALGO) read "a = b ; c" as "a=b;c". */
const char *hcomm__strip(const char *s, size_t *len);
/* Checks every HCOMM_* variable the C library reads, so a typo'd value fails at launch. */
hcomm_result_t hcomm__env_validate(const char *fn);
/* A layer above core that parses its own variable (the algorithms layer: HCOMM_ALGO) registers
 * its check here when the library loads, so hcomm__env_validate runs it without core including
 * that layer. */
typedef hcomm_result_t (*hcomm__env_check_fn)(const char *fn);
void hcomm__env_register_check(hcomm__env_check_fn check);

#endif /* HCOMM_C_ENV_H_ */
