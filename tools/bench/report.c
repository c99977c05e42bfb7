/* hcomm-bench's files: --json (one array of records), -F (CSV, the same fields) and --plot
 * (busbw against size per algorithm, drawn by gnuplot). Rank 0 keeps the records. */
#include "bench.h"

#include <math.h>
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
    else /* an empty call, or a copy too short to time */
        fprintf(f, ", \"memcpy_gbs\": null");
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

/* A ratio or bandwidth column, empty where the record has none. */
static void csv_number(FILE *f, double v, int digits) {
    if (v > 0)
        fprintf(f, ",%.*f", digits, v);
    else
        fputc(',', f);
}

/* The JSON record's fields, one column each (empty where a record lacks one); ran and chosen
 * share the chosen column, and auto_over_NAME is variant and auto_over_variant. */
static int write_csv(const bench_report_t *r, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "op,algo,chosen,bytes,count,dtype,redop,world,inplace,time_us,algbw,busbw,wrong,"
               "memcpy_gbs,regret,best,hcomm_over_raw,variant,auto_over_variant\n");
    for (int i = 0; i < r->n; i++) {
        const bench_record_t *x = &r->recs[i];
        fprintf(f, "%s,%s,%s,%zu,%zu,%s,%s,%d,%d,%.4f,%.6f,%.6f,", x->op, x->algo,
                x->chosen ? x->chosen : "", x->bytes, x->count, x->dtype,
                x->redop ? x->redop : "none", x->world, x->inplace, x->time_us, x->algbw, x->busbw);
        if (x->wrong < 0)
            fprintf(f, "N/A");
        else
            fprintf(f, "%ld", x->wrong);
        csv_number(f, x->memcpy_gbs, 6);
        csv_number(f, x->regret, 4);
        fprintf(f, ",%s", x->regret > 0 ? x->best : "");
        csv_number(f, x->vs_raw, 4);
        fprintf(f, ",%s", x->vs_variant > 0 && x->variant_name ? x->variant_name : "");
        csv_number(f, x->vs_variant, 4);
        fputc('\n', f);
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
        if (!strcmp(x->op, "memcpy") || x->bytes == 0) /* a log axis has no place for 0 */
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
            if (!strcmp(y->op, x->op) && !strcmp(y->algo, x->algo) && y->inplace == x->inplace &&
                y->bytes > 0)
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

/* Colour k (from 1) as #rrggbb: hues a golden angle apart, so no two series of a large plot
 * share one (gnuplot's own list repeats after 8). */
static const char *colour_of(int k, char rgb[8]) {
    double h = fmod((k - 1) * 0.381966, 1.0) * 6, v = 0.85, s = k % 2 ? 0.9 : 0.6;
    double f = h - floor(h), p = v * (1 - s), q = v * (1 - s * f), t = v * (1 - s * (1 - f));
    double c[6][3] = {{v, t, p}, {q, v, p}, {p, v, t}, {p, q, v}, {t, p, v}, {v, p, q}};
    const double *x = c[(int)h % 6];
    snprintf(rgb, 8, "#%02x%02x%02x", (int)(x[0] * 255), (int)(x[1] * 255), (int)(x[2] * 255));
    return rgb;
}

static void plot_lines(FILE *g, const char *data, const plot_line_t *lines, int blocks) {
    char rgb[8];
    fprintf(g, "plot ");
    for (int b = 0; b < blocks; b++) {
        fprintf(g, "%s", b ? ", " : "");
        put_quoted(g, data);
        fprintf(g,
                " index %d using 1:2 with linespoints linecolor rgb '%s' dashtype %d pointtype "
                "%d title ",
                b, colour_of(lines[b].colour, rgb), lines[b].inplace ? 2 : 1,
                lines[b].inplace ? 6 : 7);
        put_quoted(g, lines[b].title);
    }
    fprintf(g, "%s\n", blocks ? "" : "0 notitle");
}

/* The x range around the sizes drawn (one size alone has no range of its own), and a key that
 * leaves the plot its room: beside it for a few series, under it in columns for many. */
static void plot_frame(FILE *g, const bench_report_t *r, int blocks) {
    size_t lo = 0, hi = 0;
    for (int i = 0; i < r->n; i++) {
        size_t b = r->recs[i].bytes;
        if (strcmp(r->recs[i].op, "memcpy") != 0 && b > 0) {
            lo = lo == 0 || b < lo ? b : lo;
            hi = b > hi ? b : hi;
        }
    }
    if (lo > 0)
        fprintf(g, "set xrange [%g:%g]\n", lo / 1.5, hi * 1.5);
    else
        fprintf(g, "set xrange [1:1024]\nset label 'no sizes above 0 bytes' at graph 0.5,0.5 "
                   "center\n");
    if (blocks <= 12)
        fprintf(g, "set key outside right\n");
    else
        fprintf(g, "set key outside below horizontal maxcolumns 4 font ',8'\n");
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
        int h = 640 + (blocks > 12 ? (blocks + 3) / 4 * 16 : 0); /* rows of the key below */
        fprintf(g,
                "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size "
                "1000,%d noenhanced } else { set terminal png size 1000,%d noenhanced }\n",
                h, h);
        fprintf(g, "set output ");
        put_quoted(g, png);
        fprintf(g, "\nset title 'hcomm-bench: busbw per algorithm (in-place: dashed, open "
                   "points)'\n");
        fprintf(g, "set logscale x 2\nset format x '%%.0b%%B'\nset xlabel 'size (bytes)'\n"
                   "set ylabel 'busbw (GB/s)'\nset grid\n");
        plot_frame(g, r, blocks);
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
