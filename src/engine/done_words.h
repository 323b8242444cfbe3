/* done_words.h - how one child process tells the others that a task ended,
 * so a task posted to a child before its producers on other children have
 * finished (an early post, scheduler.c) waits for them there instead of
 * for the parent to relay each completion.
 *
 * Each child has a page of words in shared memory, mapped before the fork:
 * writable in its own process and the parent, read-only in its siblings
 * (zygote.c), so a child that scribbles over memory misleads at worst the
 * consumers of its own tasks, which it could mislead with wrong data
 * anyway. A task posted to child j may carry a word of j's page and a
 * stamp, unique per Worker; when the child ends it, it stores
 *     2 * stamp       ran and succeeded
 *     2 * stamp + 1   failed, or was not run
 * (release: what the task wrote is visible to whoever reads the word with
 * acquire). A waiter knows its producer only by (child, word, stamp) and
 * waits for one of those two values; anything else is an older task's.
 *
 *   who                  owns                               shares
 *   parent (the turn's   which words are in use (refs,      writes a word's final value when the
 *   holder)              free list), the stamps             task is finished here (the backstop for
 *                                                           a child lost mid-task), if not there yet
 *   child j              -                                  writes its own page's words, reads all
 *
 * A word stays in use while its task is posted and uncollected or any
 * task that waits for it is not finished here; only then may a new stamp
 * take it, so a waiter never sees its word reused under it. */
#ifndef PTO_DONE_WORDS_H
#define PTO_DONE_WORDS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* Words per child: the cells it may have posted (16) plus what tasks
 * waiting elsewhere still hold, with room to spare. */
#define PTO_DONE_WORDS 256u
/* Producers a task posted early may wait for: a mailbox cell keeps them
 * in one cache line (a stencil's task has three). */
#define PTO_DONE_WAITS 3

typedef struct pto_done_page {
    _Atomic uint64_t w[PTO_DONE_WORDS];
} pto_done_page;

/* A task's word: child, word in its page, stamp (> 0). */
typedef struct pto_done_ref {
    int32_t child;
    uint32_t word;
    uint64_t stamp;
} pto_done_ref;

/* Parent side, one per child, the turn's. */
typedef struct pto_done_words {
    pto_done_page *page;
    uint16_t refs[PTO_DONE_WORDS];
    uint16_t free[PTO_DONE_WORDS];
    uint32_t nfree;
} pto_done_words;

/* A zero-filled page in its own shared mapping; NULL with pto_errmsg. */
pto_done_page *pto_done_map(void);
void pto_done_unmap(pto_done_page *p);
/* Make p read-only in this process (a sibling's page, in a child). */
void pto_done_protect(pto_done_page *p);

/* Parent: d manages page (every word free). */
void pto_done_init(pto_done_words *d, pto_done_page *page);
/* Parent: a free word of child with the next stamp from *stamps, held once;
 * false if every word is in use (the task then carries none). */
bool pto_done_take(pto_done_words *d, int32_t child, uint64_t *stamps, pto_done_ref *out);
/* Parent: one more holder of r's word (a task that waits for it). */
void pto_done_hold(pto_done_words *d, const pto_done_ref *r);
/* Parent: r's task is finished here: its word says so (failed or not)
 * unless the child said it already. */
void pto_done_settle(pto_done_words *d, const pto_done_ref *r, bool failed);
/* Parent: a holder lets go; the last one frees the word. */
void pto_done_release(pto_done_words *d, const pto_done_ref *r);

/* The word's value that says r's task ended, and how. */
static inline uint64_t pto_done_value(uint64_t stamp, bool failed) { return 2 * stamp + (failed ? 1 : 0); }

#endif
