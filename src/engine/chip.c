/*
 * The process's chip-kernel table: callable ids -> kernels in dlopened chip
 * runtimes.
 *
 * A chip worker looks a kernel up for every task, so lookups take no lock:
 * an entry is written once, before a release store of the count publishes
 * it, and never changes. Neither entries nor libraries ever go away (a
 * kernel may be running while its id is registered again). Registration is
 * rare and takes a mutex.
 */
#include "chip.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common.h"

#define PTO_MAX_KERNELS 4096

typedef struct pto_kernel_entry {
    pto_kernel_fn fn;
    char *lib;
    char *symbol;
} pto_kernel_entry;

typedef struct pto_chip_lib {
    char *path;
    void *handle;
} pto_chip_lib;

static pto_kernel_entry kernels[PTO_MAX_KERNELS];
static _Atomic uint32_t kernel_count;

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static pto_chip_lib *libs;          /* under reg_lock */
static int32_t lib_count, lib_cap;

/* ---- where the built-in runtime lives ---- */

static pthread_once_t chipsim_once = PTHREAD_ONCE_INIT;
static const char *chipsim_path;

/* An absolute copy of p if it exists, else NULL. */
static char *existing(const char *p)
{
    char buf[PATH_MAX];
    return realpath(p, buf) ? pto_xstrdup(buf) : NULL;
}

/* Whether dir (absolute, resolved) is the build tree or inside it. */
static bool in_build_tree(const char *dir)
{
#ifdef PTO_CHIPSIM_BUILD_DIR
    char build[PATH_MAX];
    if (!realpath(PTO_CHIPSIM_BUILD_DIR, build)) return false;
    size_t n = strlen(build);
    return strncmp(dir, build, n) == 0 && (dir[n] == '\0' || dir[n] == '/');
#else
    (void)dir;
    return false;
#endif
}

/* The built-in runtime is code this process will run, so it is looked for
 * only where whoever installed this very binary put it: a binary in the
 * build tree uses the build tree's library, an installed one only paths
 * relative to its own location (its directory, and the install layout's
 * way from bindir or from the Lua C module directory to libdir). Never an
 * absolute path compiled in: a build directory under /tmp may later be
 * recreated by someone else, and an installed binary must not run their
 * library. */
static void find_chipsim(void)
{
    /* Set but missing is still the answer: dlopen then says what is wrong
     * with the path the user chose, instead of us silently using another. */
    const char *env = getenv("PTO_CHIP_RUNTIME");
    if (env && *env) {
        chipsim_path = pto_xstrdup(env);
        return;
    }
    /* The object holding this function: ptolua, pto.so, libpto.so or a
     * program linked with the static library. A static function cannot be
     * interposed, so its address is in the object we want. */
    Dl_info info;
    char obj[PATH_MAX];
    if (!dladdr((void *)find_chipsim, &info) || !info.dli_fname || !realpath(info.dli_fname, obj)) return;
    char *slash = strrchr(obj, '/');
    if (!slash) return;
    *slash = '\0';
    if (in_build_tree(obj)) {
#ifdef PTO_CHIPSIM_BUILD_PATH
        chipsim_path = existing(PTO_CHIPSIM_BUILD_PATH);
#endif
        return;
    }
    static const char *const rel[] = {
        ".",
#ifdef PTO_CHIPSIM_FROM_BINDIR
        PTO_CHIPSIM_FROM_BINDIR,
#endif
#ifdef PTO_CHIPSIM_FROM_CMODDIR
        PTO_CHIPSIM_FROM_CMODDIR,
#endif
    };
    for (size_t i = 0; i < sizeof rel / sizeof *rel && !chipsim_path; i++) {
        char *p = pto_xasprintf("%s/%s/libpto_chipsim.so", obj, rel[i]);
        chipsim_path = existing(p);
        free(p);
    }
}

const char *pto_chipsim_path(void)
{
    pthread_once(&chipsim_once, find_chipsim);
    return chipsim_path;
}

/* ---- registration ---- */

/* PROCESS mode forks while other threads may register kernels: hold the
 * registry's lock across every fork so a child never inherits it taken. */
static void atfork_prepare(void) { pthread_mutex_lock(&reg_lock); }
static void atfork_release(void) { pthread_mutex_unlock(&reg_lock); }
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void atfork_register(void) { pthread_atfork(atfork_prepare, atfork_release, atfork_release); }

/* The name a library is known by: absolute when lib names a file, so
 * "./k.so" and "/abs/k.so" are one library and a child that changed
 * directory still finds it; a bare name is left to dlopen's search. */
static char *lib_key(const char *lib)
{
    char *abs = strchr(lib, '/') ? existing(lib) : NULL;
    return abs ? abs : pto_xstrdup(lib);
}

static void *open_lib(const char *path, bool builtin)
{
    for (int32_t i = 0; i < lib_count; i++)
        if (strcmp(libs[i].path, path) == 0) return libs[i].handle;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        if (builtin)
            pto_set_error("cannot load the built-in chip runtime %s (%s); point $PTO_CHIP_RUNTIME or the "
                          "Worker's chip_runtime at a built libpto_chipsim.so", path, dlerror());
        else
            pto_set_error("cannot load chip runtime %s (%s); check the `lib` path (or the Worker's "
                          "chip_runtime)", path, dlerror());
        return NULL;
    }
    pto_grow((void **)&libs, &lib_cap, lib_count + 1, sizeof *libs);
    libs[lib_count++] = (pto_chip_lib){pto_xstrdup(path), h};
    return h;
}

static void missing_symbol(void *h, const char *path, const char *symbol)
{
    const char *const *names = dlsym(h, "pto_chip_kernels");
    if (!names) {
        pto_set_error("no kernel '%s' in %s; check the `symbol` name and that the library exports it "
                      "(not static; extern \"C\" in C++)", symbol, path);
        return;
    }
    char list[1024] = "";
    size_t len = 0;
    for (int i = 0; names[i] && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", names[i]);
    pto_set_error("no kernel '%s' in %s; it has: %s", symbol, path, list);
}

/* Called with reg_lock held. */
static int64_t add_kernel(const char *path, const char *symbol, bool builtin)
{
    uint32_t n = atomic_load_explicit(&kernel_count, memory_order_relaxed);
    for (uint32_t i = 0; i < n; i++)   /* a child's table may have holes (install_kernel) */
        if (kernels[i].fn && strcmp(kernels[i].symbol, symbol) == 0 && strcmp(kernels[i].lib, path) == 0) return i;
    if (n == PTO_MAX_KERNELS) {
        pto_set_error("the kernel table is full (%d kernels); register each kernel once and reuse its id",
                      PTO_MAX_KERNELS);
        return -1;
    }
    void *h = open_lib(path, builtin);
    if (!h) return -1;
    void *fn = dlsym(h, symbol);
    if (!fn) {
        missing_symbol(h, path, symbol);
        return -1;
    }
    kernels[n] = (pto_kernel_entry){(pto_kernel_fn)fn, pto_xstrdup(path), pto_xstrdup(symbol)};
    atomic_store_explicit(&kernel_count, n + 1, memory_order_release);
    return n;
}

int64_t pto_kernel_register(const char *lib, const char *symbol)
{
    if (!symbol || !*symbol) {
        pto_set_error("symbol is %s; name the kernel function to run, e.g. symbol = \"vector_add\"",
                      symbol ? "empty" : "missing");
        return -1;
    }
    bool builtin = lib == NULL;
    if (builtin && !(lib = pto_chipsim_path())) {
        pto_set_error("the built-in chip runtime libpto_chipsim.so was not found (a build-tree binary "
                      "looks in its build tree, an installed one only where its own install put it); set "
                      "$PTO_CHIP_RUNTIME to its path or pass `lib`");
        return -1;
    }
    char *path = lib_key(lib);
    pthread_once(&atfork_once, atfork_register);
    pthread_mutex_lock(&reg_lock);
    int64_t id = add_kernel(path, symbol, builtin);
    pthread_mutex_unlock(&reg_lock);
    free(path);
    return id;
}

pto_kernel_fn pto_kernel_lookup(uint64_t callable)
{
    uint32_t n = atomic_load_explicit(&kernel_count, memory_order_acquire);
    return callable < n ? kernels[callable].fn : NULL;
}

uint32_t pto_kernel_count(void) { return atomic_load_explicit(&kernel_count, memory_order_acquire); }

int pto_kernel_describe(uint64_t id, const char **lib, const char **symbol)
{
    if (id >= pto_kernel_count() || !kernels[id].fn) return -1;
    *lib = kernels[id].lib;
    *symbol = kernels[id].symbol;
    return 0;
}

/* ---- the THREAD-mode chip leaf ---- */

static int chip_run(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg, char *err,
                    size_t errlen)
{
    (void)ctx;
    pto_kernel_fn fn = pto_kernel_lookup(callable);
    if (PTO_UNLIKELY(!fn)) {
        snprintf(err, errlen, "chip: callable %" PRIu64 " is not a registered kernel; submit an id returned by "
                 "pto_kernel_register", callable);
        return 1;
    }
    if (errlen) err[0] = 0;
    int rc = fn(args, cfg, err, errlen);
    if (rc != 0 && errlen && !err[0]) snprintf(err, errlen, "kernel %s returned %d", kernels[callable].symbol, rc);
    return rc;
}

/* ---- the chip leaf in a child process (PROCESS mode) ----
 * ctx is the runtime the Worker's kernels come from by default (a path, or
 * NULL for the built-in one). Kernels registered before init are in the
 * table the child inherited; later ones arrive through the load hook. */

/* Load the Worker's runtime in the child, so a runtime that cannot be
 * loaded there fails init with dlopen's reason, not the first task. */
static int chip_start(void *ctx, char *err, size_t errlen)
{
    if (!ctx) return 0;   /* the built-in runtime is loaded when a kernel needs it */
    char *path = lib_key(ctx);
    pthread_mutex_lock(&reg_lock);
    void *h = open_lib(path, false);
    pthread_mutex_unlock(&reg_lock);
    free(path);
    if (!h) snprintf(err, errlen, "%s", pto_errmsg());
    return h ? 0 : 1;
}

/* blob: "lib\0symbol\0" (lib "" = ctx, or the built-in runtime): install the
 * kernel as `callable`, the id the parent gave it. The blob came through
 * shared memory: check its shape before trusting a string in it. */
static int chip_load(void *ctx, uint64_t callable, const void *blob, size_t len, char *err, size_t errlen)
{
    const char *lib = blob, *end = lib + len;
    const char *nul = memchr(lib, 0, len);
    const char *symbol = nul ? nul + 1 : NULL;
    if (!symbol || symbol >= end || !memchr(symbol, 0, (size_t)(end - symbol)) || !*symbol) {
        snprintf(err, errlen, "chip: the shipped kernel %" PRIu64 " is malformed (expected \"lib\\0symbol\\0\")",
                 callable);
        return 1;
    }
    if (callable >= PTO_MAX_KERNELS) {
        snprintf(err, errlen, "chip: kernel id %" PRIu64 " is beyond the table (%d kernels)", callable, PTO_MAX_KERNELS);
        return 1;
    }
    bool builtin = !*lib && !ctx;
    if (!*lib) lib = ctx ? ctx : pto_chipsim_path();
    if (!lib) {
        snprintf(err, errlen, "chip: the built-in chip runtime libpto_chipsim.so was not found in the child; set "
                 "$PTO_CHIP_RUNTIME");
        return 1;
    }
    char *path = lib_key(lib);
    pthread_mutex_lock(&reg_lock);
    void *h = open_lib(path, builtin);
    void *fn = h ? dlsym(h, symbol) : NULL;
    if (h && !fn) missing_symbol(h, path, symbol);
    if (fn) {
        uint32_t n = atomic_load_explicit(&kernel_count, memory_order_relaxed);
        if (!kernels[callable].fn)
            kernels[callable] = (pto_kernel_entry){(pto_kernel_fn)fn, pto_xstrdup(path), pto_xstrdup(symbol)};
        if (callable >= n) atomic_store_explicit(&kernel_count, (uint32_t)callable + 1, memory_order_release);
    }
    pthread_mutex_unlock(&reg_lock);
    free(path);
    if (!fn) snprintf(err, errlen, "%s", pto_errmsg());
    return fn ? 0 : 1;
}

pto_leaf pto_chip_leaf(void)
{
    return (pto_leaf){.run = chip_run, .ctx = NULL, .name = "chip", .start = chip_start, .load = chip_load};
}
