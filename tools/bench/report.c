/* hcomm-bench's files: --json (one array of records), -F (CSV, the same fields) and --plot
 * (busbw against size per algorithm, drawn by gnuplot). Rank 0 keeps the records. */
#include "bench.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct bench_report {
    const bench_opts_t *o;
    bench_record_t *recs;
    int n, cap;
};

/* s in memory of its own (the caller reuses its rows' names from op to op); *ok false when
 * out of memory. */
static char *keep(const char *s, bool *ok) {
    char *k = s ? strdup(s) : NULL;
    *ok = *ok && (k || !s);
    return k;
}

static void drop_names(bench_record_t *x) {
    free((char *)x->algo);
    free((char *)x->chosen);
    free((char *)x->variant_name);
}

static void report_free(bench_report_t *r) {
    for (int i = 0; i < r->n; i++)
        drop_names(&r->recs[i]);
    free(r->recs);
    free(r);
}

bench_report_t *bench_report_open(const bench_opts_t *o) {
    bench_report_t *r = calloc(1, sizeof *r);
    if (r)
        r->o = o;
    return r;
}

void bench_report_add(bench_report_t *r, const bench_record_t *rec) {
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 64;
        bench_record_t *p = realloc(r->recs, sizeof *p * (size_t)cap);
        if (!p)
            return; /* a record short in the files, never a crash */
        r->recs = p;
        r->cap = cap;
    }
    bench_record_t *x = &r->recs[r->n];
    bool ok = true;
    *x = *rec;
    x->algo = keep(rec->algo, &ok);
    x->chosen = keep(rec->chosen, &ok);
    x->variant_name = keep(rec->variant_name, &ok);
    if (ok)
        r->n++;
    else
        drop_names(x); /* a record short in the files, as above */
}

static void json_record(FILE *f, const bench_record_t *x) {
    fprintf(
        f,
        "\"op\": \"%s\", \"algo\": \"%s\", \"bytes\": %zu, \"count\": %zu, \"dtype\": \"%s\", "
        "\"redop\": \"%s\", \"world\": %d, \"inplace\": %s, \"time_us\": %.4f, \"algbw\": %.6f, "
        "\"busbw\": %.6f, \"wrong\": ",
        x->op, x->algo, x->bytes, x->count, x->dtype, x->redop ? x->redop : "none", x->world,
        x->inplace ? "true" : "false", x->time_us, x->algbw, x->busbw);
    if (x->wrong < 0)
        fprintf(f, "null");
    else
        fprintf(f, "%ld", x->wrong);
    if (x->memcpy_gbs > 0)
        fprintf(f, ", \"memcpy_gbs\": %.6f", x->memcpy_gbs);
    if (x->vs_raw > 0 && strcmp(x->algo, "auto")) /* the one algorithm asked for, on mpi */
        fprintf(f, ", \"hcomm_over_raw\": %.4f", x->vs_raw);
    if (strcmp(x->algo, "auto") && x->chosen) /* a named algorithm that fell back */
        fprintf(f, ", \"ran\": \"%s\"", x->chosen);
    if (strcmp(x->algo, "auto"))
        return;
    /* null: the op made no call that chooses */
    fprintf(f, x->chosen ? ", \"chosen\": \"%s\"" : ", \"chosen\": null", x->chosen);
    if (x->regret > 0)
        fprintf(f, ", \"regret\": %.4f, \"best\": \"%s\"", x->regret, x->best);
    if (x->vs_raw > 0)
        fprintf(f, ", \"hcomm_over_raw\": %.4f", x->vs_raw);
    if (x->vs_variant > 0)
        fprintf(f, ", \"auto_over_%s\": %.4f", x->variant_name, x->vs_variant);
}

static int write_json(const bench_report_t *r, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "[\n");
    for (int i = 0; i < r->n; i++) {
        fprintf(f, "  {");
        json_record(f, &r->recs[i]);
        fprintf(f, "}%s\n", i + 1 < r->n ? "," : "");
    }
    fprintf(f, "]\n");
    return fclose(f);
}

static int write_csv(const bench_report_t *r, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "op,algo,chosen,bytes,count,dtype,redop,world,inplace,time_us,algbw,busbw,wrong\n");
    for (int i = 0; i < r->n; i++) {
        const bench_record_t *x = &r->recs[i];
        fprintf(f, "%s,%s,%s,%zu,%zu,%s,%s,%d,%d,%.4f,%.6f,%.6f,", x->op, x->algo,
                x->chosen ? x->chosen : "", x->bytes, x->count, x->dtype,
                x->redop ? x->redop : "none", x->world, x->inplace, x->time_us, x->algbw, x->busbw);
        if (x->wrong < 0)
            fprintf(f, "N/A\n");
        else
            fprintf(f, "%ld\n", x->wrong);
    }
    return fclose(f);
}

typedef struct plot_line {
    char title[104];
    char key[88]; /* op and algo: in-place and out-of-place share a colour */
    bool inplace;
    int colour;
} plot_line_t;

/* One gnuplot data block per (op, algo, placement), sizes in order. */
static int write_plot_data(const bench_report_t *r, FILE *f, plot_line_t *lines) {
    int blocks = 0, colours = 0;
    for (int i = 0; i < r->n; i++) {
        const bench_record_t *x = &r->recs[i];
        if (!strcmp(x->op, "memcpy"))
            continue;
        plot_line_t l = {.inplace = x->inplace};
        snprintf(l.key, sizeof l.key, "%s %s", x->op, x->algo);
        snprintf(l.title, sizeof l.title, "%s%s", l.key, x->inplace ? " (in-place)" : "");
        int seen = 0;
        for (int b = 0; b < blocks; b++) {
            seen |= !strcmp(lines[b].title, l.title);
            l.colour = !strcmp(lines[b].key, l.key) ? lines[b].colour : l.colour;
        }
        if (seen)
            continue;
        l.colour = l.colour ? l.colour : ++colours;
        lines[blocks++] = l;
        for (int j = i; j < r->n; j++) {
            const bench_record_t *y = &r->recs[j];
            if (!strcmp(y->op, x->op) && !strcmp(y->algo, x->algo) && y->inplace == x->inplace)
                fprintf(f, "%zu %.6f\n", y->bytes, y->busbw);
        }
        fprintf(f, "\n\n");
    }
    return blocks;
}

/* s inside gnuplot's single quotes, where a quote is written twice. */
static void put_quoted(FILE *g, const char *s) {
    fputc('\'', g);
    for (; *s; s++)
        fputs(*s == '\'' ? "''" : (char[]){*s, 0}, g);
    fputc('\'', g);
}

static void plot_lines(FILE *g, const char *data, const plot_line_t *lines, int blocks) {
    fprintf(g, "plot ");
    for (int b = 0; b < blocks; b++) {
        fprintf(g, "%s", b ? ", " : "");
        put_quoted(g, data);
        fprintf(g,
                " index %d using 1:2 with linespoints linecolor %d dashtype %d pointtype %d "
                "title ",
                b, lines[b].colour, lines[b].inplace ? 2 : 1, lines[b].inplace ? 6 : 7);
        put_quoted(g, lines[b].title);
    }
    fprintf(g, "%s\n", blocks ? "" : "0 notitle");
}

/* pngcairo draws dashes (libgd's png terminal ignores them); open points mark in-place too. */
static int draw_plot(const bench_report_t *r, const char *png) {
    char data[] = "/tmp/hcomm-bench-plot-XXXXXX";
    int fd = mkstemp(data);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    plot_line_t *lines = f ? calloc((size_t)r->n + 1, sizeof *lines) : NULL;
    if (!lines) {
        if (f)
            fclose(f), unlink(data);
        return -1;
    }
    int blocks = write_plot_data(r, f, lines);
    fclose(f);
    FILE *g = popen("gnuplot", "w");
    if (g) {
        fprintf(g, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size "
                   "1000,640 noenhanced } else { set terminal png size 1000,640 noenhanced }\n");
        fprintf(g, "set output ");
        put_quoted(g, png);
        fprintf(g, "\nset title 'hcomm-bench: busbw per algorithm (in-place: dashed, open "
                   "points)'\n");
        fprintf(g, "set logscale x 2\nset format x '%%.0b%%B'\nset xlabel 'size (bytes)'\n"
                   "set ylabel 'busbw (GB/s)'\nset key outside right\nset grid\n");
        plot_lines(g, data, lines, blocks);
    }
    int rc = g ? pclose(g) : -1;
    unlink(data);
    free(lines);
    return rc == 0 ? 0 : -1;
}

int bench_report_close(bench_report_t *r, bool write) {
    int bad = 0;
    const bench_opts_t *o = r->o;
    if (!write) {
        report_free(r);
        return 0;
    }
    if (o->json && write_json(r, o->json) != 0)
        bad = 1, fprintf(stderr, "hcomm-bench: --json %s: cannot write the file\n", o->json);
    if (o->csv && write_csv(r, o->csv) != 0)
        bad = 1, fprintf(stderr, "hcomm-bench: -F %s: cannot write the file\n", o->csv);
    if (o->plot && draw_plot(r, o->plot) != 0)
        bad = 1, fprintf(stderr, "hcomm-bench: --plot %s: gnuplot failed to draw it\n", o->plot);
    report_free(r);
    return bad;
}
