/* done_words.c - the children's pages of task-end words (done_words.h). */
#include "done_words.h"
#include "common.h"

#include <assert.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>

pto_done_page *pto_done_map(void)
{
    void *p = mmap(NULL, sizeof(pto_done_page), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        pto_set_error("cannot map a child's page of task-end words (mmap: %s)", strerror(errno));
        return NULL;
    }
    return p;
}

void pto_done_unmap(pto_done_page *p)
{
    if (p) munmap(p, sizeof *p);
}

void pto_done_protect(pto_done_page *p)
{
    if (p) mprotect(p, sizeof *p, PROT_READ);
}

void pto_done_init(pto_done_words *d, pto_done_page *page)
{
    memset(d, 0, sizeof *d);
    d->page = page;
    for (uint32_t i = 0; i < PTO_DONE_WORDS; i++) d->free[i] = (uint16_t)(PTO_DONE_WORDS - 1 - i);
    d->nfree = PTO_DONE_WORDS;
}

bool pto_done_take(pto_done_words *d, int32_t child, uint64_t *stamps, pto_done_ref *out)
{
    if (!d->nfree) return false;
    uint32_t w = d->free[--d->nfree];
    assert(d->refs[w] == 0);
    d->refs[w] = 1;
    *out = (pto_done_ref){child, w, ++*stamps};
    return true;
}

void pto_done_hold(pto_done_words *d, const pto_done_ref *r)
{
    assert(d->refs[r->word] > 0 && d->refs[r->word] < UINT16_MAX);
    d->refs[r->word]++;
}

void pto_done_settle(pto_done_words *d, const pto_done_ref *r, bool failed)
{
    _Atomic uint64_t *w = &d->page->w[r->word];
    uint64_t v = atomic_load_explicit(w, memory_order_relaxed);
    /* The child's own answer stands: its consumers may have acted on it. */
    if (v == pto_done_value(r->stamp, false) || v == pto_done_value(r->stamp, true)) return;
    atomic_store_explicit(w, pto_done_value(r->stamp, failed), memory_order_release);
}

void pto_done_release(pto_done_words *d, const pto_done_ref *r)
{
    assert(d->refs[r->word] > 0);
    if (--d->refs[r->word] == 0) d->free[d->nfree++] = (uint16_t)r->word;
}
