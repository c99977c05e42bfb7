/* The settings that describe the machine to hcomm's algorithm selection, read as text: the
 * topology declaration (HCOMM_TOPO, or hcomm_comm_set_topo's spec) and the tuning file
 * (HCOMM_TUNING_FILE). They live in core because both the local transport (which simulates a
 * declared multi-node machine) and the topology layer above it read them. The per-communicator
 * model built from them is src/topo.
 *
 * HCOMM_TOPO: fields separated by ';', at most one shape and any per-class cost tables:
 *   mesh                 every pair of ranks linked alike (one node)
 *   ring                 ranks linked to their ring neighbours only (one node; other pairs
 *                        cost the hops between them)
 *   nodes=NxG            N nodes of G ranks, in rank order (ranks 0..G-1 on node 0, ...)
 *   nodes=A,B,...        nodes of A, B, ... ranks, in rank order (uneven sizes)
 *   intra=LAT,BW[,RED]   the intra-node link class: latency (ns, us, ms, s), bandwidth and
 *   inter=LAT,BW[,RED]   optional reduction rate (B/s, KB/s, MB/s, GB/s; decimal units)
 * Example: "nodes=2x4" (two nodes of four ranks), with ";inter=LAT,BW" to declare the link
 * between them (units as above; README.md has a worked example). Without a shape the nodes are
 * detected (host names on the mpi backend, one node on the local backend).
 *
 * HCOMM_TUNING_FILE: text, one "key = value" per line, '#' starts a comment. Keys:
 * CLASS.alpha_us (latency, microseconds), CLASS.bw_GBps (bandwidth, 1e9 bytes/s),
 * CLASS.reduce_GBps (reduction rate, 1e9 bytes/s) for CLASS intra or inter. Values from
 * HCOMM_TOPO's tables win over the file, the file over the defaults (hcomm__link_default). */
#ifndef HCOMM_C_CORE_TOPO_SPEC_H_
#define HCOMM_C_CORE_TOPO_SPEC_H_

#include "core/internal.h"

#include <stdint.h>

enum { HCOMM__TOPO_DETECT = 0, HCOMM__TOPO_MESH, HCOMM__TOPO_RING, HCOMM__TOPO_NODES };
enum { HCOMM__LINK_INTRA = 0, HCOMM__LINK_INTER, HCOMM__LINK_CLASSES };
enum { HCOMM__TOPO_MAX_LIST = 64 }; /* node sizes a "nodes=A,B,..." list may give */

/* One link class of the alpha-beta-gamma model (Hockney; Thakur, Rabenseifner & Gropp 2005):
 * sending n bytes costs alpha + n * beta seconds, reducing n bytes n * gamma. */
typedef struct hcomm__link {
    double alpha, beta, gamma;
} hcomm__link_t;

typedef struct hcomm__topo_spec {
    int kind;                           /* HCOMM__TOPO_* */
    int nnodes, per_node;               /* NODES: per_node > 0 for NxG, else sizes[] */
    int sizes[HCOMM__TOPO_MAX_LIST];    /* NODES as a list */
    bool has_link[HCOMM__LINK_CLASSES]; /* a class table was given */
    hcomm__link_t link[HCOMM__LINK_CLASSES];
    uint64_t digest; /* of what it declares (equal texts or not), 0 for the detected one */
} hcomm__topo_spec_t;

/* Parses text (var names it in messages: "HCOMM_TOPO" or "spec") into *out; NULL or "" is
 * the detected topology. An unknown form is HCOMM_ERR_INVALID_ARG naming var and the forms. */
hcomm_result_t hcomm__topo_spec_parse(const char *fn, const char *var, const char *text,
                                      hcomm__topo_spec_t *out);
/* HCOMM_TOPO, parsed once per process (a malformed value reads as the detected topology;
 * hcomm__topo_spec_env_validate reports it, as hcomm_launch does). */
const hcomm__topo_spec_t *hcomm__topo_spec_env(void);
hcomm_result_t hcomm__topo_spec_env_validate(const char *fn);
/* Fails unless HCOMM_TOPO's node shape (if any) declares exactly world ranks. */
hcomm_result_t hcomm__topo_spec_env_fits(const char *fn, int world);
/* Ranks a NODES spec declares (0 for other kinds). */
int hcomm__topo_spec_ranks(const hcomm__topo_spec_t *s);
/* The node of rank r under a NODES spec (-1 past the declared ranks). */
int hcomm__topo_spec_node(const hcomm__topo_spec_t *s, int r);

/* The link classes hcomm assumes: the defaults, overridden by HCOMM_TUNING_FILE (read once
 * per process; a malformed file leaves the defaults and hcomm__tuning_validate reports it). */
void hcomm__link_default(hcomm__link_t link[HCOMM__LINK_CLASSES]);
hcomm_result_t hcomm__tuning_validate(const char *fn);

/* FNV-1a over n bytes from h (HCOMM__FNV_SEED to start): the selection digests' hash. */
#define HCOMM__FNV_SEED 0xcbf29ce484222325ull
uint64_t hcomm__fnv(const void *p, size_t n, uint64_t h);

/* Digests of the settings every rank must share: what HCOMM_ALGO allows (0 when unset; its
 * text where the algorithms layer registered no digest), what HCOMM_TOPO declares, the tuning
 * file's contents and HCOMM_CHECK's mode (the defaults differ with checking off), in that order,
 * then HCOMM_EAGER_LIMIT's bytes (a receiver's buffers for eager messages are that large). */
enum {
    HCOMM__SEL_ALGO,
    HCOMM__SEL_TOPO,
    HCOMM__SEL_TUNING,
    HCOMM__SEL_CHECK,
    HCOMM__SEL_EAGER,
    HCOMM__SEL_COUNT
};
void hcomm__selection_digests(uint64_t out[HCOMM__SEL_COUNT]);
/* The algorithms layer parses HCOMM_ALGO; it registers the digest of the parsed value here when
 * the library loads (core cannot include that layer). */
typedef uint64_t (*hcomm__algo_digest_fn)(void);
void hcomm__selection_register_algo_digest(hcomm__algo_digest_fn fn);
/* The variable each digest comes from. */
const char *hcomm__selection_var(int i);

#endif /* HCOMM_C_CORE_TOPO_SPEC_H_ */
