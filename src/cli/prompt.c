/* prompt.c - reading lines at ptolua's prompt: readline's callback
 * interface (so that Ctrl-C clears the line), the history file, TAB
 * completion through pto.repl.complete, and giving up the interpreter lock
 * while waiting for input. ptolua.c (the lua.c-like host) compiles and runs
 * what is read. Without readline, lines come from getline. */
#include "prompt.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <unistd.h>

#include "lauxlib.h"
#include "lua.h"

#include "lpto.h"

#ifdef PTO_HAVE_READLINE
#include <readline/history.h>
#include <readline/readline.h>
#endif

/* At the full prompt SIGINT only sets this flag, from the moment the
 * prompt opens until it closes, except while docall runs a chunk (which
 * installs on_sigint and puts this back). So a Ctrl-C that lands between
 * two chunks (while results print, say) cannot kill the session, as it
 * would with SIG_DFL there. Installed without SA_RESTART so that the wait
 * for input is interrupted. */
static volatile sig_atomic_t prompt_sigint;

/* The state whose interpreter lock the prompt gives up while it waits for
 * input, so that THREAD-mode sub callables of tasks released at the prompt
 * (:step, :release) run meanwhile; its globals are what TAB completes. */
static lua_State *prompt_L;

/* Registry reference to the pto.repl module table at the full prompt;
 * LUA_NOREF in the plain loop. */
static int full_ref = LUA_NOREF;
static void *idle_token;
static void idle(int begin) {
  if (!prompt_L) return;
  if (begin) idle_token = lpto_idle_begin(prompt_L);
  else lpto_idle_end(prompt_L, idle_token);
}
static void on_prompt_sigint(int sig) {
  (void)sig;
  prompt_sigint = 1;
}

#ifdef PTO_HAVE_READLINE
#define HISTORY_MAX 1000 /* lines kept in memory and in the file */

static char history_path[PATH_MAX]; /* "" when there is no history file */

/* The line readline's callback interface hands over. The callback
 * interface (rather than readline()) is what lets Ctrl-C at the prompt
 * clear the line: readline() retries its read after a signal, while here
 * the loop sees the interrupted wait and abandons the line itself. */
static char *cb_line;
static int cb_done;
static void on_line(char *line) {
  cb_line = line;
  cb_done = 1;
  rl_callback_handler_remove(); /* restores the terminal before Lua runs */
}

/* SIGINT is blocked except inside pselect, so the flag is never set behind
 * the loop's back between its check and the wait. A Ctrl-C from before
 * the prompt appeared is forgotten. */
static char *read_line_tty(const char *prompt, int *interrupted) {
  sigset_t block, old_mask;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigprocmask(SIG_BLOCK, &block, &old_mask);
  prompt_sigint = 0;
  cb_line = NULL;
  cb_done = 0;
  *interrupted = 0;
  rl_callback_handler_install(prompt, on_line);
  while (!cb_done) {
    fd_set fds;
    int r;
    FD_ZERO(&fds);
    FD_SET(STDIN_FILENO, &fds);
    /* SIGINT can arrive only while waiting here (old_mask unblocks it). */
    idle(1);
    r = pselect(STDIN_FILENO + 1, &fds, NULL, NULL, NULL, &old_mask);
    idle(0);
    if (prompt_sigint) {
      prompt_sigint = 0;
      rl_callback_sigcleanup();
      rl_replace_line("", 0); /* the next prompt starts empty */
      rl_callback_handler_remove();
      fputs("\n", stdout);
      fflush(stdout);
      *interrupted = 1;
      break;
    }
    if (r < 0) {
      if (errno == EINTR) continue; /* another signal: keep reading */
      rl_callback_handler_remove(); /* unreadable stdin: end of input */
      break;
    }
    rl_callback_read_char(); /* may call on_line */
  }
  sigprocmask(SIG_SETMASK, &old_mask, NULL);
  return cb_line;
}

/* ~/.ptolua_history, or $PTOLUA_HISTORY; none without either. Lines are
 * appended as they are entered (so a crash or os.exit loses nothing) and
 * the file is cut to HISTORY_MAX lines when the prompt opens and closes. */
static void history_open(void) {
  const char *env = getenv("PTOLUA_HISTORY");
  const char *home = getenv("HOME");
  int n = -1;
  history_path[0] = '\0';
  if (env && env[0] != '\0')
    n = snprintf(history_path, sizeof history_path, "%s", env);
  else if (home && home[0] != '\0')
    n = snprintf(history_path, sizeof history_path, "%s/.ptolua_history", home);
  if (n < 0 || (size_t)n >= sizeof history_path) { /* none, or too long */
    history_path[0] = '\0';
    return;
  }
  using_history();
  stifle_history(HISTORY_MAX);
  read_history(history_path); /* a missing file is an empty history */
  history_truncate_file(history_path, HISTORY_MAX);
}

static void history_add(const char *line) {
  if (line[0] == '\0') return;
  add_history(line);
  if (history_path[0] == '\0') return;
  /* append_history needs an existing file; a first write creates it. */
  if (append_history(1, history_path) != 0) write_history(history_path);
}

static void history_close(void) {
  if (history_path[0] != '\0') history_truncate_file(history_path, HISTORY_MAX);
}

/* ---- completion ---- */

static char **cands;          /* this completion's candidates, malloc'ed */
static size_t ncands;

/* Run inside lua_pcall: pto.repl.complete(text, at_start, line, before)
 * (before: the line up to the word, so that the word's place is known,
 * e.g. a key inside pto.CallConfig{...}), results
 * checked to be an array of strings, and true when it asked for a file
 * name ({files = true}). Everything that
 * can raise (allocation included) happens here, never on readline's stack
 * outside a pcall. */
static int complete_collect(lua_State *L) {
  const char *text = lua_touserdata(L, 1);
  int at_start = lua_toboolean(L, 2);
  lua_Integer start = lua_tointeger(L, 3);
  const char *line = rl_line_buffer ? rl_line_buffer : "";
  size_t len = strlen(line);
  lua_Integer i, n;
  lua_rawgeti(L, LUA_REGISTRYINDEX, full_ref);
  lua_getfield(L, -1, "complete");
  lua_pushstring(L, text);
  lua_pushboolean(L, at_start);
  lua_pushstring(L, line);
  lua_pushlstring(L, line, start >= 0 && (size_t)start <= len ? (size_t)start : len);
  lua_call(L, 4, 1);
  luaL_checktype(L, -1, LUA_TTABLE);
  lua_pushliteral(L, "files");
  if (lua_rawget(L, -2) != LUA_TNIL) return 2; /* {files = true}: a file name */
  lua_pop(L, 1);
  n = luaL_len(L, -1);
  for (i = 1; i <= n; i++) {
    if (lua_rawgeti(L, -1, i) != LUA_TSTRING) luaL_error(L, "completion: not a string");
    lua_pop(L, 1);
  }
  lua_pushboolean(L, 0);
  return 2;
}

static char *cand_generator(const char *text, int state) {
  static size_t next;
  (void)text;
  if (state == 0) next = 0;
  if (next >= ncands) return NULL;
  return strdup(cands[next++]); /* readline frees what it is given */
}

static char **attempt_completion(const char *text, int start, int end) {
  lua_State *L = prompt_L;
  int top = lua_gettop(L);
  char **matches = NULL;
  size_t i;
  (void)end;
  rl_attempted_completion_over = 1; /* never fall back to file names */
  /* readline resets this to ' ' before every completion */
  rl_completion_append_character = '\0';
  if (full_ref == LUA_NOREF || !lua_checkstack(L, 8)) return NULL;
  ncands = 0;
  lua_pushcfunction(L, complete_collect);
  lua_pushlightuserdata(L, (void *)text);
  lua_pushboolean(L, start == 0);
  lua_pushinteger(L, start);
  int ok = lua_pcall(L, 3, 2, 0) == LUA_OK; /* candidates, and whether to complete a file name */
  int files = ok && lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (files) {
    /* a file name (:dot FILE): readline's own completer, '/' after directories */
    rl_filename_completion_desired = 1;
    matches = rl_completion_matches(text, rl_filename_completion_function);
  } else if (ok) {
    size_t n = (size_t)lua_rawlen(L, -1);
    cands = n ? calloc(n, sizeof *cands) : NULL;
    if (cands) {
      for (i = 0; i < n; i++) { /* checked above to be strings: no raise */
        lua_rawgeti(L, -1, (lua_Integer)i + 1);
        cands[ncands] = strdup(lua_tostring(L, -1));
        if (cands[ncands]) ncands++;
        lua_pop(L, 1);
      }
      matches = rl_completion_matches(text, cand_generator);
      for (i = 0; i < ncands; i++) free(cands[i]);
      free(cands);
      cands = NULL;
      ncands = 0;
    }
  }
  lua_settop(L, top); /* a failing completer just completes nothing */
  return matches;
}

/* Words end at these; '.' and ':' are not among them so that
 * "string.fo" and "w:reg" reach the completer whole. */
static char word_breaks[] = " \t\n\"'`@$><=;|&{}()[],+-*/%^#~";
/* A file name (:dot /tmp/x.dot) ends only at blanks. */
static char file_breaks[] = " \t\n";

static int takes_file_call(lua_State *L) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, full_ref);
  lua_getfield(L, -1, "takes_file");
  lua_pushstring(L, rl_line_buffer ? rl_line_buffer : "");
  lua_call(L, 1, 1);
  return 1;
}

/* readline asks which characters end the word before each completion:
 * pto.repl.takes_file(line) says whether that word is a file name. */
static char *word_break_hook(void) {
  lua_State *L = prompt_L;
  int top, file = 0;
  if (!L || full_ref == LUA_NOREF || !lua_checkstack(L, 4)) return NULL;
  top = lua_gettop(L);
  lua_pushcfunction(L, takes_file_call);
  if (lua_pcall(L, 0, 1, 0) == LUA_OK) file = lua_toboolean(L, -1);
  lua_settop(L, top);
  return file ? file_breaks : NULL; /* NULL: rl_completer_word_break_characters */
}

#endif /* PTO_HAVE_READLINE */

char *prompt_read(const char *prompt, int *interrupted) {
  *interrupted = 0;
#ifdef PTO_HAVE_READLINE
  if (full_ref != LUA_NOREF) return read_line_tty(prompt, interrupted);
  idle(1);
  char *line = readline(prompt);
  idle(0);
  return line;
#else
  char *line = NULL;
  size_t cap = 0;
  fputs(prompt, stdout);
  fflush(stdout);
  prompt_sigint = 0;
  idle(1);
  ssize_t got = getline(&line, &cap, stdin);
  idle(0);
  if (got < 0) {
    free(line);
    /* Ctrl-C at the full prompt interrupts the read: a fresh prompt */
    if (full_ref != LUA_NOREF && prompt_sigint) {
      clearerr(stdin);
      fputs("\n", stdout);
      *interrupted = 1;
    }
    return NULL;
  }
  return line;
#endif
}

void prompt_save(const char *line) {
#ifdef PTO_HAVE_READLINE
  if (full_ref != LUA_NOREF) history_add(line);
  else if (line[0] != '\0') add_history(line);
#else
  (void)line;
#endif
}

void prompt_open(lua_State *L, int repl_ref) {
  prompt_L = L;
  full_ref = repl_ref;
#ifdef PTO_HAVE_READLINE
  rl_readline_name = "ptolua";
#endif
  if (full_ref == LUA_NOREF) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_prompt_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
#ifdef PTO_HAVE_READLINE
  rl_catch_signals = 0; /* SIGINT is ours (read_line_tty, ptolua.c's docall) */
  rl_attempted_completion_function = attempt_completion;
  rl_completer_word_break_characters = word_breaks;
  rl_completion_word_break_hook = word_break_hook;
  history_open();
#endif
}

void prompt_close(void) {
  if (full_ref != LUA_NOREF) {
#ifdef PTO_HAVE_READLINE
    history_close();
#endif
    signal(SIGINT, SIG_DFL); /* as outside the prompt */
  }
  prompt_L = NULL;
  full_ref = LUA_NOREF;
}
