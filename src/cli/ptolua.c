/* ptolua.c - the ptolua program: the lua5.4 command line with pto built in.
 *
 * Observable behaviour (options, the `arg` table, error reports, exit
 * status, the REPL) follows the stock `lua` program of Lua 5.4 so that
 * scripts and habits carry over. The differences: `pto` is preloaded
 * (package.preload.pto and the global `pto`; its Lua parts are compiled
 * in, so package.path and package.cpath are exactly lua5.4's), -h/--help
 * exists, Ctrl-C escalates in three steps during a run (on_sigint), an
 * error in a script piped on stdin exits 1 (lua5.4 exits 0), and input ending inside an incomplete
 * chunk at the prompt shows its syntax error (lua5.4 prints "(null)"), and
 * --trace FILE / --dot FILE record every Worker (docs/tracing.md), and
 * --check runs every Worker in check mode (docs/check.md).
 * On a terminal the prompt goes further than lua5.4 (docs/repl.md): values
 * printed by lua/pto/repl.lua, `:` commands, a history file, completion of
 * fields and methods, Ctrl-C at the prompt clearing the line.
 *
 * Everything runs inside one protected call (pmain) so that even a memory
 * error ends with a message, and main always closes the state so that __gc
 * and to-be-closed values (pto Workers among them) run before the process
 * exits; only os.exit without its `close` argument skips that, as in Lua. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lauxlib.h"
#include "lua.h"
#include "lualib.h"

#include "lpto.h"
#include "pto_version.h"
#include "lpto_trace.h"
#include "prompt.h"

#define INIT_VAR "LUA_INIT"
#define INIT_VAR_VERSIONED INIT_VAR "_" LUA_VERSION_MAJOR "_" LUA_VERSION_MINOR

/* Prefix of error messages; lua5.4 uses argv[0], and NULL in the REPL. */
static const char *progname = "ptolua";

/* The state the SIGINT handler arms its hook on. Set before the handler is
 * installed and never changed while it is, so the handler only reads it. */
static lua_State *volatile sigint_L;

/* --trace FILE, --dot FILE, --report FILE (argv strings), or NULL; --profile. */
static const char *trace_path, *dot_path, *report_path;
static int profile_flag;

static int is_file_option(const char *a) {
  return strcmp(a, "--trace") == 0 || strcmp(a, "--dot") == 0 || strcmp(a, "--report") == 0;
}

#define CLI_RECORDS() (trace_path || dot_path || report_path || profile_flag)

/* ---- messages ---------------------------------------------------------- */

static void l_message(const char *pname, const char *msg) {
  if (pname) fprintf(stderr, "%s: ", pname);
  fprintf(stderr, "%s\n", msg);
  fflush(stderr);
}

/* Print and pop the error on top of the stack, if status is one. */
static int report(lua_State *L, int status) {
  if (status != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    l_message(progname, msg ? msg : "(error object is not a string)");
    lua_pop(L, 1);
  }
  return status;
}

static void print_usage(FILE *f, const char *badoption) {
  if (badoption) {
    /* -e and -l are only "bad" when their argument is missing. */
    if (badoption[1] == 'e' || badoption[1] == 'l' || is_file_option(badoption))
      fprintf(f, "%s: '%s' needs argument\n", progname, badoption);
    else
      fprintf(f, "%s: unrecognized option '%s'\n", progname, badoption);
  }
  fprintf(f,
          "usage: %s [options] [script [args]]\n"
          "Available options are:\n"
          "  -e stat     execute string 'stat'\n"
          "  -i          enter interactive mode after executing 'script'\n"
          "  -l mod      require library 'mod' into global 'mod'\n"
          "  -l g=mod    require library 'mod' into global 'g'\n"
          "  -v          show version information\n"
          "  -E          ignore environment variables\n"
          "  -W          turn warnings on\n"
          "  -h, --help  show this help and exit\n"
          "  --trace f   write a Chrome trace (Perfetto, chrome://tracing) of every\n"
          "              Worker the script creates to file 'f' at exit\n"
          "  --dot f     write the DAG of every Worker's last run to file 'f'\n"
          "              (Graphviz) at exit: coloured by callable, condensed above\n"
          "              500 tasks; drawn from the run's profile, it slows no run\n"
          "  --check     run every Worker in check mode (PTO_CHECK=1): each task is\n"
          "              checked against its tags, and may run twice (docs/check.md)\n"
          "  --check=warn  the same, but every finding is a warning on stderr\n"
          "              (PTO_CHECK=warn): tasks succeed, submits go ahead\n"
          "  --profile   print the profile of every Worker's last run to stderr at exit\n"
          "  --report f  write an HTML run report (profile, timeline, DAG) to 'f' at exit\n"
          "  --          stop handling options\n"
          "  -           stop handling options and execute stdin\n"
          "The pto module is preloaded as the global 'pto'.\n",
          progname);
  fflush(f);
}

static void print_version(lua_State *L) {
  int top = lua_gettop(L);
  const char *v = PTO_VERSION; /* when pto._VERSION is missing */
  /* Raw reads: printing the version must not run user metamethods. */
  lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  lua_pushliteral(L, "pto");
  if (lua_rawget(L, -2) == LUA_TTABLE) {
    lua_pushliteral(L, "_VERSION");
    if (lua_rawget(L, -2) == LUA_TSTRING) v = lua_tostring(L, -1);
  }
  printf("ptolua %s (pto engine) -- %s\n", v, LUA_COPYRIGHT);
  fflush(stdout);
  lua_settop(L, top);
}

/* ---- running chunks ---------------------------------------------------- */

/* Hook armed by the SIGINT handler: runs at the next Lua event of the main
 * thread, where raising an error is safe (a signal handler cannot). */
static void interrupt_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0); /* one shot */
  luaL_error(L, "interrupted!");
}

/* Ctrl-C escalates, one step per press while a chunk runs (docall resets
 * the count): the first stops dispatch and lets running tasks finish, the
 * second kills the children busy with a task (their tasks fail, the run
 * raises "interrupted"), only the third leaves ptolua, with the default
 * action (exit status 130 to the shell). The first (and, without a run,
 * the second) also arms the hook, so Lua code that is running stops with
 * "interrupted!". The steps are announced on stderr whenever a run was in
 * progress; Lua code alone is interrupted as quietly as by lua5.4. */
static volatile sig_atomic_t sigint_count;
/* The last chunk ended in an error after a Ctrl-C: a script stopped that way
 * exits 130, as a shell reports a command that SIGINT ended (lua5.4 says 1). */
static int last_call_interrupted;

static void say(const char *msg) {
  ssize_t r = write(STDERR_FILENO, msg, strlen(msg));
  (void)r; /* nothing to do about a closed stderr in a signal handler */
}

/* Async-signal-safe only: lua_sethook is documented as safe to call from a
 * signal handler, and lpto_interrupt promises the same. */
static void on_sigint(int sig) {
  int saved_errno = errno;
  int step = ++sigint_count;
  if (step >= 3) {
    say("\nptolua: interrupted a third time: leaving\n");
    signal(sig, SIG_DFL);
    raise(sig); /* delivered when the handler returns */
    errno = saved_errno;
    return;
  }
  int runs = lpto_interrupt(); /* the engine kills busy children at a run's second */
  if (runs > 0 && step == 1)
    say("\nptolua: interrupted: no new task starts; running tasks finish "
        "(Ctrl-C again stops them, a third time leaves ptolua)\n");
  if (runs > 0 && step == 2) {
    say("\nptolua: interrupted again: child processes busy with a task are killed and "
        "their tasks fail; tasks in threads cannot be stopped (Ctrl-C again leaves ptolua)\n");
    /* The run now fails by itself with the run's own error: a pending
     * "interrupted!" from the first press would replace it. */
    lua_sethook(sigint_L, NULL, 0, 0);
  } else {
    lua_sethook(sigint_L, interrupt_hook,
                LUA_MASKCALL | LUA_MASKRET | LUA_MASKLINE | LUA_MASKCOUNT, 1);
  }
  errno = saved_errno;
}

static void set_sigint(void (*handler)(int), struct sigaction *old) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  /* SA_RESTART: blocking reads resume as under lua5.4's signal(). */
  if (handler != SIG_DFL) sa.sa_flags = SA_RESTART;
  sigint_count = 0;
  sigaction(SIGINT, &sa, old);
}

/* Message handler: add a traceback to string errors; other error objects
 * use __tostring (without traceback, as lua5.4) or say their type. */
static int msghandler(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
      return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* Call the function below narg arguments with the message handler, with
 * Ctrl-C turned into an "interrupted!" error while it runs. */
static int docall(lua_State *L, int narg, int nres) {
  int base = lua_gettop(L) - narg;
  int status;
  struct sigaction old;
  lua_pushcfunction(L, msghandler);
  lua_insert(L, base);
  sigint_L = L;
  set_sigint(on_sigint, &old);
  status = lua_pcall(L, narg, nres, base);
  last_call_interrupted = status != LUA_OK && sigint_count > 0;
  /* Put back what was there (SIG_DFL, or the prompt's handler), then
   * disarm a hook that a Ctrl-C right at the end of the call armed but no
   * Lua code consumed: it must not interrupt the next, unrelated, code. */
  sigaction(SIGINT, &old, NULL);
  if (lua_gethook(L) == interrupt_hook) lua_sethook(L, NULL, 0, 0);
  lua_remove(L, base);
  return status;
}

static int dochunk(lua_State *L, int status) {
  if (status == LUA_OK) status = docall(L, 0, 0);
  return report(L, status);
}

static int dostring(lua_State *L, const char *s, const char *name) {
  return dochunk(L, luaL_loadbuffer(L, s, strlen(s), name));
}

/* -l mod or -l g=mod: global g (default mod) = require(mod). */
static int dolibrary(lua_State *L, const char *spec) {
  const char *eq = strchr(spec, '=');
  const char *glob = eq ? lua_pushlstring(L, spec, (size_t)(eq - spec))
                        : lua_pushstring(L, spec); /* kept on the stack */
  int status;
  lua_getglobal(L, "require");
  lua_pushstring(L, eq ? eq + 1 : spec);
  status = docall(L, 1, 1);
  if (status == LUA_OK) lua_setglobal(L, glob);
  report(L, status);
  lua_pop(L, 1); /* glob */
  return status;
}

/* ---- setup ------------------------------------------------------------- */

/* package.preload.pto = luaopen_pto; pto = require "pto". */
static int open_pto(lua_State *L) {
  int status;
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_pto);
  lua_setfield(L, -2, "pto");
  lua_pop(L, 1);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "pto");
  status = docall(L, 1, 1);
  if (status == LUA_OK) lua_setglobal(L, "pto");
  return report(L, status);
}

/* arg[0] = script, arg[1..] = its arguments, arg[-k] = what came before;
 * without a script arg[0] is the interpreter. */
static void create_arg_table(lua_State *L, int argc, char **argv, int script) {
  int i;
  if (script == argc) script = 0;
  lua_createtable(L, argc - script - 1 > 0 ? argc - script - 1 : 0, script + 1);
  for (i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - script);
  }
  lua_setglobal(L, "arg");
}

static int handle_luainit(lua_State *L) {
  const char *name = "=" INIT_VAR_VERSIONED;
  const char *init = getenv(name + 1);
  if (init == NULL) {
    name = "=" INIT_VAR;
    init = getenv(name + 1);
  }
  if (init == NULL) return LUA_OK;
  if (init[0] == '@') return dochunk(L, luaL_loadfile(L, init + 1));
  return dostring(L, init, name);
}

/* ---- command line ------------------------------------------------------ */

enum {
  ARG_ERROR = 1, /* bad option: argv[*first] */
  ARG_I = 2,     /* -i */
  ARG_V = 4,     /* -v (and -i) */
  ARG_EXEC = 8,  /* -e */
  ARG_NOENV = 16, /* -E */
  ARG_HELP = 32, /* -h, --help */
};

/* Scan the options; *first = index of the script (argc if none). Only
 * checks syntax: -e, -l and -W take effect later, in order (runargs). */
static int collectargs(int argc, char **argv, int *first) {
  int flags = 0;
  int i;
  for (i = 1; i < argc; i++) {
    const char *a = argv[i];
    *first = i;
    if (a[0] != '-') return flags; /* the script */
    if (strcmp(a, "--help") == 0) return ARG_HELP;
    if (strcmp(a, "--check") == 0 || strcmp(a, "--check=warn") == 0) {
      /* through the environment, so Workers in forked children see it too */
      setenv("PTO_CHECK", a[7] ? "warn" : "1", 1);
      continue;
    }
    if (is_file_option(a)) { /* "--trace FILE": the next argument, whatever it is */
      if (++i >= argc) return ARG_ERROR;
      if (a[2] == 't') trace_path = argv[i];
      else if (a[2] == 'r') report_path = argv[i];
      else dot_path = argv[i];
      continue;
    }
    if (strcmp(a, "--profile") == 0) {
      profile_flag = 1;
      continue;
    }
    switch (a[1]) {
    case '-': /* "--": the next argument is the script, whatever it is */
      if (a[2] != '\0') return ARG_ERROR;
      *first = i + 1;
      return flags;
    case '\0': /* "-": the script is stdin */
      return flags;
    case 'h':
      return a[2] != '\0' ? ARG_ERROR : ARG_HELP;
    case 'E':
      if (a[2] != '\0') return ARG_ERROR;
      flags |= ARG_NOENV;
      break;
    case 'W':
      if (a[2] != '\0') return ARG_ERROR;
      break;
    case 'i':
      if (a[2] != '\0') return ARG_ERROR;
      flags |= ARG_I | ARG_V;
      break;
    case 'v':
      if (a[2] != '\0') return ARG_ERROR;
      flags |= ARG_V;
      break;
    case 'e':
    case 'l': /* both take an argument, attached ("-eCODE") or next */
      if (a[1] == 'e') flags |= ARG_EXEC;
      if (a[2] == '\0') {
        i++;
        if (i >= argc || argv[i][0] == '-') return ARG_ERROR;
      }
      break;
    default:
      return ARG_ERROR;
    }
  }
  *first = argc;
  return flags;
}

/* Run -e, -l and -W in command-line order; stop at the first error. */
static int runargs(lua_State *L, char **argv, int script) {
  int i;
  for (i = 1; i < script; i++) {
    char opt = argv[i][1];
    if (is_file_option(argv[i])) { /* taken by collectargs; its file is no option */
      i++;
      continue;
    }
    if (opt == 'e' || opt == 'l') {
      const char *val = argv[i][2] != '\0' ? argv[i] + 2 : argv[++i];
      int status = opt == 'e' ? dostring(L, val, "=(command line)") : dolibrary(L, val);
      if (status != LUA_OK) return 0;
    } else if (opt == 'W') {
      lua_warning(L, "@on", 0);
    }
  }
  return 1;
}

/* Push arg[1..#arg] (the global, as -e or LUA_INIT may have changed it). */
static int pushargs(lua_State *L) {
  int i, n;
  if (lua_getglobal(L, "arg") != LUA_TTABLE) luaL_error(L, "'arg' is not a table");
  n = (int)luaL_len(L, -1);
  luaL_checkstack(L, n + 3, "too many arguments to script");
  for (i = 1; i <= n; i++) lua_rawgeti(L, -i, i);
  lua_remove(L, -i);
  return n;
}

static int handle_script(lua_State *L, char **argv, int script) {
  const char *fname = argv[script];
  int status;
  /* "-" is stdin, unless "--" made it a file name. */
  if (strcmp(fname, "-") == 0 && strcmp(argv[script - 1], "--") != 0) fname = NULL;
  status = luaL_loadfile(L, fname);
  if (status == LUA_OK) status = docall(L, pushargs(L), 0);
  return report(L, status);
}

/* ---- REPL -------------------------------------------------------------- */

/* The prompt has two faces. When stdin is a terminal it is the full prompt
 * of docs/repl.md: values printed by pto.repl (tables pretty-printed), `:`
 * commands, a persistent history, TAB completion, Ctrl-C clearing the line.
 * When stdin is not a terminal (input piped to `ptolua -i`) it stays the
 * plain lua5.4 loop, byte for byte as before, so that scripted use and
 * spec/cli_spec.lua see no change; no history file is read or written
 * then, since piped input is not something a user wants to recall.
 * Reading a line (readline, history, completion, Ctrl-C) is src/cli/prompt.c;
 * compiling and running it is here. */

/* pushline results besides "a line" (1) and "end of input" (0). */
#define LINE_INTERRUPTED (-1)
/* loadline results besides the lua_load status codes and -1 (end). */
#define CHUNK_CANCELLED 100 /* Ctrl-C at a continuation prompt */
#define CHUNK_COMMAND 101   /* a ":command" line, left on the stack */

/* Registry reference to the pto.repl module table; LUA_NOREF in the plain
 * loop (and if the module failed to load, which leaves the plain loop). */
static int repl_ref = LUA_NOREF;

/* Push the next input line (without its newline): 1, or 0 at end of
 * input, or LINE_INTERRUPTED (nothing pushed) after Ctrl-C at the full
 * prompt. The prompt is _PROMPT / _PROMPT2 when set, as in lua5.4. */
static int pushline(lua_State *L, int firstline) {
  const char *prompt = firstline ? "> " : ">> ";
  char *line;
  size_t len;
  int interrupted;
  if (lua_getglobal(L, firstline ? "_PROMPT" : "_PROMPT2") != LUA_TNIL)
    prompt = luaL_tolstring(L, -1, NULL); /* stays on the stack while used */
  line = prompt_read(prompt, &interrupted);
  lua_settop(L, lua_gettop(L) - (lua_isnil(L, -1) ? 1 : 2));
  if (line == NULL) return interrupted ? LINE_INTERRUPTED : 0;
  len = strlen(line);
  if (len > 0 && line[len - 1] == '\n') line[--len] = '\0';
  if (firstline && line[0] == '=') /* "=expr" is the old "return expr" */
    lua_pushfstring(L, "return %s", line + 1);
  else
    lua_pushlstring(L, line, len);
  free(line);
  return 1;
}

/* Try the line as an expression first, so that its value gets printed. */
static int addreturn(lua_State *L) {
  const char *line = lua_tostring(L, -1);
  const char *retline = lua_pushfstring(L, "return %s;", line);
  int status = luaL_loadbuffer(L, retline, strlen(retline), "=stdin");
  if (status == LUA_OK) {
    lua_remove(L, -2); /* retline; the original line stays below */
    prompt_save(line);
  } else {
    lua_pop(L, 2); /* error message and retline */
  }
  return status;
}

/* A chunk is incomplete when its syntax error is at the end of input. */
static int incomplete(lua_State *L, int status) {
  static const char mark[] = "<eof>";
  size_t len;
  const char *msg;
  if (status != LUA_ERRSYNTAX) return 0;
  msg = lua_tolstring(L, -1, &len);
  return len >= sizeof mark - 1 && strcmp(msg + len - (sizeof mark - 1), mark) == 0;
}

/* Compile the line at index 1 as a statement, reading continuation lines
 * while it is incomplete. */
static int multiline(lua_State *L) {
  for (;;) {
    size_t len;
    const char *line = lua_tolstring(L, 1, &len);
    int status = luaL_loadbuffer(L, line, len, "=stdin");
    int more;
    if (!incomplete(L, status)) {
      prompt_save(line);
      return status;
    }
    more = pushline(L, 0);
    if (more == LINE_INTERRUPTED) { /* Ctrl-C drops the unfinished chunk */
      prompt_save(line);
      lua_pop(L, 1); /* the "<eof>" error */
      return CHUNK_CANCELLED;
    }
    /* At end of input the syntax error stays on the stack to be shown
     * (lua5.4 pops it first and prints "(null)"). */
    if (!more) {
      prompt_save(line);
      return status;
    }
    lua_remove(L, -2); /* the "<eof>" error */
    lua_pushliteral(L, "\n");
    lua_insert(L, -2);
    lua_concat(L, 3); /* line .. "\n" .. next line */
  }
}

/* Read and compile one chunk: the function (or error) is left on top;
 * -1 at end of input; CHUNK_COMMAND with the ":..." line on top. */
static int loadline(lua_State *L) {
  int status, got;
  lua_settop(L, 0);
  while ((got = pushline(L, 1)) == LINE_INTERRUPTED) {
  } /* Ctrl-C at the prompt: a fresh prompt */
  if (!got) return -1;
  if (repl_ref != LUA_NOREF && lua_tostring(L, 1)[0] == ':') {
    prompt_save(lua_tostring(L, 1));
    return CHUNK_COMMAND;
  }
  if ((status = addreturn(L)) != LUA_OK) status = multiline(L);
  if (status == CHUNK_CANCELLED) {
    lua_settop(L, 0);
    return status;
  }
  lua_remove(L, 1); /* the source line */
  return status;
}

/* Print the values on the stack: pto.repl.print_results at the full
 * prompt, the global print (as lua5.4) in the plain loop. */
static void print_results(lua_State *L) {
  int n = lua_gettop(L);
  if (n == 0) return;
  luaL_checkstack(L, LUA_MINSTACK, "too many results to print");
  if (repl_ref != LUA_NOREF) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, repl_ref);
    lua_getfield(L, -1, "print_results");
    lua_remove(L, -2);
  } else {
    lua_getglobal(L, "print");
  }
  lua_insert(L, 1);
  if (lua_pcall(L, n, 0, 0) != LUA_OK)
    l_message(progname, lua_pushfstring(L, "error calling 'print' (%s)", lua_tostring(L, -1)));
}

/* Run the ":..." line on top through pto.repl.command; 1 when it asks to
 * leave the prompt. Runs under docall, so Ctrl-C and errors behave as for
 * any chunk. */
static int run_command(lua_State *L) {
  int status, quit = 0;
  lua_rawgeti(L, LUA_REGISTRYINDEX, repl_ref);
  lua_getfield(L, -1, "command");
  lua_remove(L, -2);
  lua_insert(L, -2); /* command(line) */
  status = docall(L, 1, 1);
  if (status == LUA_OK) {
    const char *r = lua_tostring(L, -1);
    quit = r != NULL && strcmp(r, "quit") == 0;
    lua_pop(L, 1);
  }
  report(L, status);
  return quit;
}

/* Load pto.repl for the full prompt; on failure say why and keep the plain
 * loop, which still works. */
static void repl_open(lua_State *L) {
  lua_getglobal(L, "require");
  lua_pushliteral(L, "pto.repl");
  if (docall(L, 1, 1) == LUA_OK && lua_istable(L, -1)) {
    repl_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  } else {
    if (!lua_isstring(L, -1)) lua_pushliteral(L, "pto.repl is not a table");
    report(L, LUA_ERRRUN);
    lua_settop(L, 0);
  }
}

/* pto.repl.after_line(), after each line the prompt ran: what happened
 * meanwhile that the user must hear of before the next prompt (a caught
 * failure, docs/repl.md) is printed there, not by the engine's threads,
 * which would write into the line being edited. */
static void after_line(lua_State *L) {
  if (repl_ref == LUA_NOREF) return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, repl_ref);
  lua_getfield(L, -1, "after_line");
  lua_remove(L, -2);
  if (!lua_isfunction(L, -1)) {
    lua_pop(L, 1);
    return;
  }
  report(L, docall(L, 0, 0));
}

static void repl(lua_State *L) {
  const char *saved = progname;
  int status;
  progname = NULL; /* errors at the prompt carry no program name */
  lua_settop(L, 0);
  if (isatty(STDIN_FILENO)) repl_open(L);
  prompt_open(L, repl_ref);
  while ((status = loadline(L)) != -1) {
    if (status == CHUNK_CANCELLED) continue;
    if (status == CHUNK_COMMAND) {
      if (run_command(L)) break;
      after_line(L);
      continue;
    }
    if (status == LUA_OK) status = docall(L, 0, LUA_MULTRET);
    if (status == LUA_OK) print_results(L);
    else report(L, status);
    after_line(L);
  }
  lua_settop(L, 0);
  fputs("\n", stdout);
  fflush(stdout);
  prompt_close();
  if (repl_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, repl_ref);
  repl_ref = LUA_NOREF;
  progname = saved;
}

/* ---- main -------------------------------------------------------------- */

/* Everything that can raise runs here, protected: returns true on success. */
static int pmain(lua_State *L) {
  int argc = (int)lua_tointeger(L, 1);
  char **argv = lua_touserdata(L, 2);
  int script;
  int flags = collectargs(argc, argv, &script);
  luaL_checkversion(L);
  if (flags == ARG_ERROR) {
    print_usage(stderr, argv[script]);
    return 0;
  }
  if (flags == ARG_HELP) {
    print_usage(stdout, NULL);
    lua_pushboolean(L, 1);
    return 1;
  }
  if (flags & ARG_NOENV) { /* tells package to ignore LUA_PATH etc. */
    lua_pushboolean(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, "LUA_NOENV");
  }
  luaL_openlibs(L);
  if (open_pto(L) != LUA_OK) return 0;
  if (CLI_RECORDS()) {
    lua_pushcfunction(L, lpto_trace_cli);
    lua_pushstring(L, trace_path);
    lua_pushstring(L, dot_path);
    lua_pushboolean(L, profile_flag);
    lua_pushstring(L, report_path);
    if (report(L, docall(L, 4, 0)) != LUA_OK) return 0;
  }
  create_arg_table(L, argc, argv, script);
  lua_gc(L, LUA_GCRESTART); /* stopped in main while the libraries load */
  lua_gc(L, LUA_GCGEN, 0, 0); /* generational, as lua5.4 */
  if (flags & ARG_V) print_version(L);
  if (!(flags & ARG_NOENV) && handle_luainit(L) != LUA_OK) return 0;
  if (!runargs(L, argv, script)) return 0;
  if (script < argc && handle_script(L, argv, script) != LUA_OK) return 0;
  if (flags & ARG_I) {
    repl(L);
  } else if (script == argc && !(flags & (ARG_EXEC | ARG_V))) {
    if (isatty(STDIN_FILENO)) {
      print_version(L);
      repl(L);
    } else if (dochunk(L, luaL_loadfile(L, NULL)) != LUA_OK) {
      return 0;
    }
  }
  lua_pushboolean(L, 1);
  return 1;
}

int main(int argc, char **argv) {
  lua_State *L;
  int status, ok;
  if (argc > 0 && argv[0][0] != '\0') progname = argv[0];
  L = luaL_newstate();
  if (L == NULL) {
    l_message(progname, "cannot create state: not enough memory");
    return EXIT_FAILURE;
  }
  lpto_use_pool_allocator(L); /* idiomatic orchestration loops allocate per task */
  lua_gc(L, LUA_GCSTOP);
  lua_pushcfunction(L, pmain);
  lua_pushinteger(L, argc);
  lua_pushlightuserdata(L, argv);
  status = lua_pcall(L, 2, 1, 0);
  ok = lua_toboolean(L, -1);
  report(L, status);
  /* Written whatever the script did: a failing run is what one traces. */
  if (CLI_RECORDS()) {
    lua_settop(L, 0);
    lua_pushcfunction(L, lpto_trace_cli_finish);
    if (report(L, lua_pcall(L, 0, 0, 0)) != LUA_OK) ok = 0;
  }
  lua_close(L); /* runs __gc and pending to-be-closed values */
  if (status == LUA_OK && ok) return EXIT_SUCCESS;
  return last_call_interrupted ? 128 + SIGINT : EXIT_FAILURE;
}
