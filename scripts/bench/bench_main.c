/*
 * bench_main.c - pto_bench: empty tasks through ptolua, OpenMP and StarPU.
 *
 * Runs each selected DAG shape through each selected system, keeps the best
 * of N repetitions, and prints a throughput table (millions of tasks per
 * second) with ptolua's ratios to the two baselines and the project goals:
 * ptolua >= 5x StarPU and >= OpenMP on every shape. The goals are
 * informational; the exit status is non-zero only on errors. --metg adds
 * the METG(50%) table (metg.c), --metg-only prints only that;
 * --efficiency=LIST prints only the efficiency at the task durations of LIST
 * (best of --reps runs), to compare two builds at fixed durations.
 *
 *   pto_bench [--quick] [--shapes=LIST] [--systems=LIST] [--reps=N] [--metg|--metg-only]
 *   pto_bench --efficiency=2,4,8 [--reps=N]
 * Both print the floors under PROCESS mode beside the systems (floor_procs.c).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "bench.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

enum { SYS_PTOLUA, SYS_OMP, SYS_STARPU, NSYS };
enum { SH_W1, SH_W2, SH_W3, SH_W4S, SH_W4L, NSHAPES };

static const char *const sys_key[NSYS] = { "ptolua", "openmp", "starpu" };

typedef struct sizes {
    int w1;        /* tasks */
    int w2;        /* tasks */
    int w3;        /* fan groups */
    int w4s_dim;   /* small bgemm edge */
    int w4s_reps;  /* small bgemm repetitions */
    int w4l_dim;   /* large bgemm edge */
} sizes;

static const sizes full_sizes = { 200000, 200000, 20000, 4, 200, 16 };
static const sizes quick_sizes = { 20000, 20000, 2000, 4, 20, 8 };

static const char *const shape_key[NSHAPES] = { "w1", "w2", "w3", "w4s", "w4l" };

static void shape_label(int sh, const sizes *z, char *out, size_t cap)
{
    switch (sh) {
    case SH_W1: snprintf(out, cap, "W1 independent"); break;
    case SH_W2: snprintf(out, cap, "W2 chain"); break;
    case SH_W3: snprintf(out, cap, "W3 fan 1->%d->1", BENCH_FAN); break;
    case SH_W4S:
        snprintf(out, cap, "W4 bgemm %d^4 x%d", z->w4s_dim, z->w4s_reps);
        break;
    default: snprintf(out, cap, "W4 bgemm %d^4", z->w4l_dim); break;
    }
}

static long long shape_tasks(int sh, const sizes *z)
{
    switch (sh) {
    case SH_W1: return z->w1;
    case SH_W2: return z->w2;
    case SH_W3: return (long long)z->w3 * BENCH_W3_TASKS_PER_GROUP;
    case SH_W4S: return BENCH_W4_TASKS(z->w4s_dim) * z->w4s_reps;
    default: return BENCH_W4_TASKS(z->w4l_dim);
    }
}

static double run_one(int sys, int sh, const sizes *z)
{
    switch (sys) {
    case SYS_PTOLUA:
        switch (sh) {
        case SH_W1: return ptolua_w1(z->w1);
        case SH_W2: return ptolua_w2(z->w2);
        case SH_W3: return ptolua_w3(z->w3);
        case SH_W4S: return ptolua_w4(z->w4s_dim, z->w4s_reps);
        default: return ptolua_w4(z->w4l_dim, 1);
        }
#ifdef PTO_BENCH_HAVE_OPENMP
    case SYS_OMP:
        switch (sh) {
        case SH_W1: return omp_w1(z->w1);
        case SH_W2: return omp_w2(z->w2);
        case SH_W3: return omp_w3(z->w3);
        case SH_W4S: return omp_w4(z->w4s_dim, z->w4s_reps);
        default: return omp_w4(z->w4l_dim, 1);
        }
#endif
#ifdef PTO_BENCH_HAVE_STARPU
    case SYS_STARPU:
        switch (sh) {
        case SH_W1: return starpu_w1(z->w1);
        case SH_W2: return starpu_w2(z->w2);
        case SH_W3: return starpu_w3(z->w3);
        case SH_W4S: return starpu_w4(z->w4s_dim, z->w4s_reps);
        default: return starpu_w4(z->w4l_dim, 1);
        }
#endif
    default:
        return -1.0;
    }
}

static int sys_setup(int sys)
{
    switch (sys) {
    case SYS_PTOLUA: return ptolua_setup();
#ifdef PTO_BENCH_HAVE_OPENMP
    case SYS_OMP: return omp_bench_setup();
#endif
#ifdef PTO_BENCH_HAVE_STARPU
    case SYS_STARPU: return starpu_bench_setup();
#endif
    default: return -1;
    }
}

static void sys_teardown(int sys)
{
    switch (sys) {
    case SYS_PTOLUA: ptolua_teardown(); break;
#ifdef PTO_BENCH_HAVE_OPENMP
    case SYS_OMP: omp_bench_teardown(); break;
#endif
#ifdef PTO_BENCH_HAVE_STARPU
    case SYS_STARPU: starpu_bench_teardown(); break;
#endif
    default: break;
    }
}

static const char *sys_describe(int sys)
{
    switch (sys) {
    case SYS_PTOLUA: return ptolua_describe();
#ifdef PTO_BENCH_HAVE_OPENMP
    case SYS_OMP: return omp_bench_describe();
#endif
#ifdef PTO_BENCH_HAVE_STARPU
    case SYS_STARPU: return starpu_bench_describe();
#endif
    default: return "";
    }
}

static void usage(FILE *f, const char *prog)
{
    fprintf(f,
            "usage: %s [--quick] [--shapes=LIST] [--systems=LIST] [--reps=N] [--metg|--metg-only]\n"
            "  --quick         smaller sizes for a smoke run\n"
            "  --shapes=LIST   comma-separated: w1,w2,w3,w4 (= w4s,w4l),w4s,w4l,all (default all)\n"
            "  --systems=LIST  comma-separated: ptolua,openmp,starpu,all (default all)\n"
            "  --reps=N        repetitions per (shape, system); the best is kept (default 3)\n"
            "  --metg          also measure METG(50%%) (ptolua thread/process, OpenMP, StarPU)\n"
            "  --metg-only     only the METG table\n"
            "  --efficiency=LIST  only the efficiency of ptolua (both modes) and OpenMP at the task\n"
            "                  durations of LIST (us, e.g. 2,4,8), both METG shapes, best of --reps runs\n"
            "shapes: w1 independent, w2 chain, w3 fan 1->8->1, w4s small bgemm (repeated),\n"
            "        w4l large bgemm\n",
            prog);
}

/* Value of "--name=V" or "--name V"; advances *i for the second form. */
static const char *opt_value(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0)
        return NULL;
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n] == '\0' && *i + 1 < argc)
        return argv[++*i];
    return NULL;
}

/* Parse a comma-separated list of keys into sel[]; 0 or -1 on unknown key. */
static int parse_list(const char *list, const char *const *keys, int nkeys, int *sel, int is_shapes)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (int k = 0; k < nkeys; k++)
        sel[k] = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int found = 0;
        if (strcmp(tok, "all") == 0) {
            for (int k = 0; k < nkeys; k++)
                sel[k] = 1;
            found = 1;
        } else if (is_shapes && strcmp(tok, "w4") == 0) {
            sel[SH_W4S] = sel[SH_W4L] = 1;
            found = 1;
        } else {
            for (int k = 0; k < nkeys; k++)
                if (strcasecmp(tok, keys[k]) == 0) {
                    sel[k] = 1;
                    found = 1;
                }
            if (!is_shapes && (strcmp(tok, "omp") == 0)) {
                sel[SYS_OMP] = 1;
                found = 1;
            }
        }
        if (!found) {
            fprintf(stderr, "pto_bench: unknown %s '%s'\n", is_shapes ? "shape" : "system", tok);
            return -1;
        }
    }
    return 0;
}

static void fmt_rate(char *out, size_t cap, double rate)
{
    if (rate > 0)
        snprintf(out, cap, "%.3f", rate);
    else if (rate < 0)
        snprintf(out, cap, "ERR");
    else
        snprintf(out, cap, "-");
}

static void fmt_ratio(char *out, size_t cap, double a, double b)
{
    if (a > 0 && b > 0)
        snprintf(out, cap, "%.2fx", a / b);
    else
        snprintf(out, cap, "-");
}

/* Machine-wide CPU time from /proc/stat, in clock ticks: busy and total
 * (busy + idle + iowait). False if unavailable. */
static int cpu_ticks(unsigned long long *busy, unsigned long long *total)
{
    unsigned long long v[8] = { 0 };
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return 0;
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n < 4)
        return 0;
    /* user nice system idle iowait irq softirq steal */
    *busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    *total = *busy + v[3] + v[4];
    return 1;
}

/* utime + stime of /proc/<pid>/stat in clock ticks, and its parent; false
 * if the process is gone or unreadable. The command name may hold spaces
 * and parentheses: the fields start after its last ')'. */
static int proc_stat(const char *pid, long *ppid, unsigned long long *ticks)
{
    char path[300], buf[1024];
    snprintf(path, sizeof path, "/proc/%s/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long long ut, st;
    /* state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (!p || sscanf(p + 1, " %*c %ld %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", ppid, &ut, &st) != 3)
        return 0;
    *ticks = ut + st;
    return 1;
}

/* CPU ticks of the live descendants of this process: PROCESS-mode
 * children, their forkserver and lower-level Workers are not in
 * RUSAGE_SELF, and counted as other processes they made every PROCESS
 * run look like a shared machine. */
static unsigned long long descendants_ticks(void)
{
    enum { MAXP = 4096 };
    static long pids[MAXP], ppids[MAXP];
    static unsigned long long ticks[MAXP];
    int n = 0;
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d)) != NULL && n < MAXP;) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        if (proc_stat(e->d_name, &ppids[n], &ticks[n])) {
            pids[n] = atol(e->d_name);
            n++;
        }
    }
    closedir(d);
    unsigned long long sum = 0;
    long self = (long)getpid();
    for (int i = 0; i < n; i++)
        for (long p = ppids[i], hops = 0; p > 1 && hops < 16; hops++) {   /* walk up to this process or init */
            if (p == self) {
                sum += ticks[i];
                break;
            }
            int j = 0;
            while (j < n && pids[j] != p) j++;
            if (j == n)
                break;
            p = ppids[j];
        }
    return sum;
}

/* CPU seconds used by this process (all its threads) and its descendants,
 * live and reaped, so far. */
static double self_cpu(void)
{
    struct rusage ru, rc;
    if (getrusage(RUSAGE_SELF, &ru) != 0 || getrusage(RUSAGE_CHILDREN, &rc) != 0)
        return 0.0;
    long hz = sysconf(_SC_CLK_TCK);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           (double)ru.ru_stime.tv_usec * 1e-6 + (double)rc.ru_utime.tv_sec + (double)rc.ru_utime.tv_usec * 1e-6 +
           (double)rc.ru_stime.tv_sec + (double)rc.ru_stime.tv_usec * 1e-6 +
           (hz > 0 ? (double)descendants_ticks() / (double)hz : 0.0);
}

/* Share of the machine's CPU time that other processes used between two
 * samples, or -1 if unknown: a measure of how much the numbers are to be
 * trusted on a shared machine. */
typedef struct cpu_sample {
    int ok;
    unsigned long long busy, total;
    double self;
} cpu_sample;

static cpu_sample cpu_sample_now(void)
{
    cpu_sample c;
    c.ok = cpu_ticks(&c.busy, &c.total);
    c.self = self_cpu();
    return c;
}

static double foreign_load(cpu_sample a, cpu_sample b)
{
    long hz = sysconf(_SC_CLK_TCK);
    if (!a.ok || !b.ok || b.total <= a.total || hz <= 0)
        return -1.0;
    double busy = (double)(b.busy - a.busy);
    double self = (b.self - a.self) * (double)hz;
    double f = (busy - self) / (double)(b.total - a.total);
    return f < 0 ? 0.0 : f;
}

static void print_foreign(double foreign)
{
    if (foreign >= 0)
        printf("other processes used %.0f%% of the machine's CPU time during the run%s\n",
               100.0 * foreign, foreign > 0.05 ? " (the machine was shared: numbers are unreliable)" : "");
}

int main(int argc, char **argv)
{
    int quick = 0, reps = 3, metg = 0;
    const char *eff_list = NULL;
    int shape_sel[NSHAPES], sys_sel[NSYS];
    for (int i = 0; i < NSHAPES; i++) shape_sel[i] = 1;
    for (int i = 0; i < NSYS; i++) sys_sel[i] = 1;

    for (int i = 1; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "--quick") == 0 || strcmp(argv[i], "-q") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--metg") == 0) {
            metg = 1;
        } else if (strcmp(argv[i], "--metg-only") == 0) {
            metg = 2;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout, argv[0]);
            return 0;
        } else if ((v = opt_value(argc, argv, &i, "--efficiency")) != NULL) {
            eff_list = v;
        } else if ((v = opt_value(argc, argv, &i, "--shapes")) != NULL) {
            if (parse_list(v, shape_key, NSHAPES, shape_sel, 1) != 0) return 2;
        } else if ((v = opt_value(argc, argv, &i, "--systems")) != NULL) {
            if (parse_list(v, sys_key, NSYS, sys_sel, 0) != 0) return 2;
        } else if ((v = opt_value(argc, argv, &i, "--reps")) != NULL) {
            reps = atoi(v);
            if (reps < 1) {
                fprintf(stderr, "pto_bench: --reps must be >= 1\n");
                return 2;
            }
        } else {
            fprintf(stderr, "pto_bench: unknown argument '%s'\n", argv[i]);
            usage(stderr, argv[0]);
            return 2;
        }
    }

    if (eff_list) {
        const cpu_sample m0 = cpu_sample_now();
        int e = bench_metg_points(eff_list, reps);
        print_foreign(foreign_load(m0, cpu_sample_now()));
        return e ? 1 : 0;
    }
    if (metg == 2) {
        const cpu_sample m0 = cpu_sample_now();
        int e = bench_metg_main(quick);
        print_foreign(foreign_load(m0, cpu_sample_now()));
        return e ? 1 : 0;
    }
    const sizes *z = quick ? &quick_sizes : &full_sizes;
    int have_starpu = 0, have_omp = 0;
#ifdef PTO_BENCH_HAVE_STARPU
    have_starpu = 1;
#endif
#ifdef PTO_BENCH_HAVE_OPENMP
    have_omp = 1;
#endif

    const cpu_sample cpu0 = cpu_sample_now();
    /* best[sh][sys]: best seconds; 0 = not run; < 0 = error */
    double best[NSHAPES][NSYS];
    char *desc[NSYS] = { NULL, NULL, NULL };
    memset(best, 0, sizeof best);
    int errors = 0;

    for (int sys = 0; sys < NSYS; sys++) {
        if (!sys_sel[sys])
            continue;
        if ((sys == SYS_STARPU && !have_starpu) || (sys == SYS_OMP && !have_omp))
            continue;
        if (sys_setup(sys) != 0) {
            fprintf(stderr, "pto_bench: %s setup failed\n", sys_key[sys]);
            for (int sh = 0; sh < NSHAPES; sh++)
                if (shape_sel[sh]) best[sh][sys] = -1.0;
            errors++;
            continue;
        }
        desc[sys] = strdup(sys_describe(sys));
        for (int sh = 0; sh < NSHAPES; sh++) {
            if (!shape_sel[sh])
                continue;
            char label[64];
            shape_label(sh, z, label, sizeof label);
            fprintf(stderr, "  %-7s %-22s", sys_key[sys], label);
            double b = 0.0;
            for (int r = 0; r < reps; r++) {
                double t = run_one(sys, sh, z);
                if (t < 0) {
                    fprintf(stderr, " ERROR\n");
                    b = -1.0;
                    errors++;
                    break;
                }
                fprintf(stderr, " %.4fs", t);
                if (b == 0.0 || t < b)
                    b = t;
            }
            if (b > 0)
                fprintf(stderr, "  best %.4fs\n", b);
            best[sh][sys] = b;
        }
        sys_teardown(sys);
    }

    /* rates in Mtasks/s (0 = not run, -1 = error) */
    double rate[NSHAPES][NSYS];
    for (int sh = 0; sh < NSHAPES; sh++)
        for (int sys = 0; sys < NSYS; sys++) {
            double t = best[sh][sys];
            rate[sh][sys] = t > 0 ? (double)shape_tasks(sh, z) / t / 1e6 : (t < 0 ? -1.0 : 0.0);
        }

    struct utsname un;
    const char *machine = "?", *kernel = "?";
    if (uname(&un) == 0) {
        machine = un.machine;
        kernel = un.release;
    }
    printf("pto_bench: empty tasks, %d worker threads per system, best of %d%s\n",
           BENCH_THREADS, reps, quick ? " (--quick sizes)" : "");
    const double foreign = foreign_load(cpu0, cpu_sample_now());
    printf("machine: nproc=%ld, uname -m=%s, kernel %s\n", sysconf(_SC_NPROCESSORS_ONLN), machine,
           kernel);
    print_foreign(foreign);
    for (int sys = 0; sys < NSYS; sys++)
        if (desc[sys])
            printf("%s\n", desc[sys]);
    printf("\n%-22s %9s %16s %16s %16s %14s %14s\n", "shape", "tasks", "ptolua Mtasks/s",
           "openmp Mtasks/s", "starpu Mtasks/s", "ptolua/openmp", "ptolua/starpu");
    for (int sh = 0; sh < NSHAPES; sh++) {
        if (!shape_sel[sh])
            continue;
        char label[64], c0[32], c1[32], c2[32], r1[32], r2[32];
        shape_label(sh, z, label, sizeof label);
        fmt_rate(c0, sizeof c0, rate[sh][SYS_PTOLUA]);
        fmt_rate(c1, sizeof c1, rate[sh][SYS_OMP]);
        fmt_rate(c2, sizeof c2, rate[sh][SYS_STARPU]);
        fmt_ratio(r1, sizeof r1, rate[sh][SYS_PTOLUA], rate[sh][SYS_OMP]);
        fmt_ratio(r2, sizeof r2, rate[sh][SYS_PTOLUA], rate[sh][SYS_STARPU]);
        printf("%-22s %9lld %16s %16s %16s %14s %14s\n", label, shape_tasks(sh, z), c0, c1, c2,
               r1, r2);
    }
#ifdef PTO_BENCH_HAVE_OPENMP
    /* Untimed, after every timed run: what OpenMP's W1 rate measures. */
    if (shape_sel[SH_W1] && best[SH_W1][SYS_OMP] > 0) {
        double share = omp_w1_inline_share(z->w1);
        if (share >= 0)
            printf("openmp W1: the creating thread ran %.0f%% of the tasks itself (libgomp runs a task at once "
                   "where it is created while more than 64 per thread are queued; ptolua runs every task on "
                   "a worker)\n", 100.0 * share);
    }
    if (shape_sel[SH_W3] && best[SH_W3][SYS_OMP] > 0) {
        double share = omp_w3_inline_share(z->w3);
        if (share >= 0)
            printf("openmp W3: the creating thread ran %.0f%% of the tasks itself\n", 100.0 * share);
    }
#endif
    if (!have_omp && sys_sel[SYS_OMP])
        printf("OpenMP: skipped (the compiler has no OpenMP support)\n");
    if (!have_starpu && sys_sel[SYS_STARPU])
        printf("StarPU: skipped (libstarpu-dev not installed)\n");

    printf("\ngoals (informational): ptolua >= 5x StarPU and ptolua >= OpenMP on every shape\n");
    int pass = 0, miss = 0, na = 0;
    for (int sh = 0; sh < NSHAPES; sh++) {
        if (!shape_sel[sh])
            continue;
        char label[64];
        shape_label(sh, z, label, sizeof label);
        for (int g = 0; g < 2; g++) {
            int other = g == 0 ? SYS_STARPU : SYS_OMP;
            double need = g == 0 ? 5.0 : 1.0;
            double a = rate[sh][SYS_PTOLUA], b = rate[sh][other];
            char goal[96];
            snprintf(goal, sizeof goal, "ptolua >= %s%s on %s", g == 0 ? "5x " : "",
                     g == 0 ? "starpu" : "openmp", label);
            if (a > 0 && b > 0) {
                int ok = a >= need * b;
                ok ? pass++ : miss++;
                printf("  %-44s %s (%.2fx)\n", goal, ok ? "PASS" : "MISS", a / b);
            } else {
                na++;
                printf("  %-44s n/a (%s)\n", goal,
                       (other == SYS_STARPU && !have_starpu) ? "StarPU skipped"
                       : (other == SYS_OMP && !have_omp)     ? "OpenMP skipped"
                       : (a < 0 || b < 0)                   ? "error"
                                                            : "not run");
            }
        }
    }
    printf("goals: %d PASS, %d MISS, %d n/a\n", pass, miss, na);
    if (metg) {
        const cpu_sample m0 = cpu_sample_now();
        errors += bench_metg_main(quick);
        print_foreign(foreign_load(m0, cpu_sample_now()));
    }
    for (int sys = 0; sys < NSYS; sys++)
        free(desc[sys]);
    if (errors)
        fprintf(stderr, "pto_bench: %d error(s)\n", errors);
    return errors ? 1 : 0;
}
