/* tests/test-chat-pty.c — `atlas chat` driven as a person would drive it: the real binary
 * (ATLAS_BIN) on a pseudo-terminal (forkpty), keys typed into it and its screen read back.
 * In process (-m models/default) and against an `atlas serve` this test starts on a free
 * port (--url), it must answer through the model's chat template exactly what `atlas run`
 * prints, greedily, for the same conversation rendered by the public template API (so the
 * conversation, /system, /clear and multi-line input are checked by their effect on the
 * prompt; /load too), stream an answer that Ctrl-C then stops while the program lives on,
 * and leave with status 0 on /bye and on Ctrl-D. A script on stdin (no terminal) answers
 * likewise. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "atlas/template.h"
#include "harness.h"

static const char *bin, *model;
static char tmpdir[512];

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* --- a program on a pseudo-terminal, its screen as text (carriage returns dropped) ---------- */

typedef struct term {
    pid_t pid;
    int fd;
    char buf[1 << 18];
    size_t len, seen; /* seen: where the next expect starts looking */
} term;

static int term_start(term *t, char *const argv[]) {
    memset(t, 0, sizeof *t);
    struct winsize ws = {.ws_row = 40, .ws_col = 200};
    t->pid = forkpty(&t->fd, NULL, NULL, &ws);
    if (t->pid < 0) return perror("forkpty"), -1;
    if (t->pid == 0) {
        setenv("TERM", "xterm", 1);
        execv(argv[0], argv);
        _exit(127);
    }
    return 0;
}

/* Reads what the program writes for up to secs seconds, or until it closes the terminal. */
static void term_read(term *t, double secs) {
    double end = now() + secs;
    for (;;) {
        int ms = (int)((end - now()) * 1000);
        if (ms < 0) ms = 0;
        struct pollfd p = {t->fd, POLLIN, 0};
        if (poll(&p, 1, ms) <= 0) return;
        char b[4096];
        ssize_t n = read(t->fd, b, sizeof b);
        if (n <= 0) return; /* EIO: the program is gone */
        for (ssize_t i = 0; i < n; i++)
            if (b[i] != '\r' && t->len + 1 < sizeof t->buf) t->buf[t->len++] = b[i];
        t->buf[t->len] = 0;
    }
}

/* Waits until what follows t->seen holds s; moves seen past it. The offset of s, or -1
 * after secs seconds. */
static long expect(term *t, const char *s, double secs) {
    double end = now() + secs;
    for (;;) {
        char *hit = strstr(t->buf + t->seen, s);
        if (hit) {
            t->seen = (size_t)(hit - t->buf) + strlen(s);
            return hit - t->buf;
        }
        if (now() >= end) {
            fprintf(stderr, "expected '%s' in:\n---\n%s\n---\n", s, t->buf + t->seen);
            return -1;
        }
        term_read(t, 0.05);
    }
}

static void type(term *t, const char *keys) {
    size_t n = strlen(keys);
    if (write(t->fd, keys, n) != (ssize_t)n) perror("write to the pty");
}

/* Types a line (Enter is "\r" on a terminal) and waits for the next prompt. */
static int line(term *t, const char *text, const char *reply) {
    type(t, text);
    type(t, "\r");
    return (reply ? expect(t, reply, 30) >= 0 : 1) && expect(t, ">>> ", 30) >= 0;
}

/* Sends a user turn and returns its answer as the screen shows it (malloc'd): the text
 * between the echoed input and the blank line before the next prompt. */
static char *ask(term *t, const char *keys, const char *last_echo) {
    type(t, keys);
    if (expect(t, last_echo, 30) < 0 || expect(t, "\n", 30) < 0) return NULL;
    size_t from = t->seen;
    long at = expect(t, "\n\n>>> ", 60);
    if (at < 0) return NULL;
    return strndup(t->buf + from, (size_t)at - from);
}

/* The exit status, waiting up to secs seconds (-1: still running, then killed). */
static int wait_exit(pid_t pid, double secs) {
    double end = now() + secs;
    int st;
    while (now() < end) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(20000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

/* --- what `atlas run` answers for a conversation ------------------------------------------- */

static atlas_template *tmpl;

/* The greedy continuation of the rendered conversation msgs, n tokens (malloc'd, without
 * run's closing newline). */
static char *run_answer(const json_t *msgs, int n) {
    char *js = json_dumps(msgs, JSON_COMPACT), *prompt = NULL;
    CHECK_OK(atlas_template_render_str(tmpl, js, NULL, true, NULL, &prompt));
    free(js);
    if (!prompt) return NULL;
    char path[600], cmd[2048];
    snprintf(path, sizeof path, "%s/prompt.txt", tmpdir);
    FILE *f = fopen(path, "w");
    if (!f) return free(prompt), NULL;
    fputs(prompt, f);
    fclose(f);
    free(prompt);
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' --device cpu --temp 0 -n %d -f '%s' 2>/dev/null",
             bin, model, n, path);
    char *out = malloc(1 << 16);
    int rc = harness_run(cmd, out, 1 << 16);
    CHECK_MSG(rc == 0, "%s: exit %d", cmd, rc);
    size_t len = strlen(out);
    if (len && out[len - 1] == '\n') out[--len] = 0;
    return out;
}

static void add(json_t *msgs, const char *role, const char *content) {
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", role, "content",
                                          content ? content : ""));
}

/* The answer on screen must be run's for the conversation; it then joins the conversation. */
static void check_turn(term *t, json_t *msgs, const char *keys, const char *last_echo,
                       const char *user, int n) {
    add(msgs, "user", user);
    char *got = ask(t, keys, last_echo), *want = run_answer(msgs, n);
    CHECK_MSG(got && want && !strcmp(got, want), "'%s': chat answered '%s', run '%s'", user,
              got ? got : "(nothing)", want ? want : "(nothing)");
    CHECK(want && strlen(want) > 0);
    add(msgs, "assistant", got);
    free(got);
    free(want);
}

/* Starts a long answer (up to 900 tokens) to "Hello there", Ctrl-C as soon as its first text
 * shows: the prompt must come back with the process alive, the text shown run's whole answer
 * cut short (the same 900 tokens: a slow machine may show hundreds of tokens before the
 * Ctrl-C is seen, but an answer that ran to its end was not stopped). */
static void check_interrupt(term *t) {
    static char *full;
    if (!full) {
        json_t *msgs = json_array();
        add(msgs, "user", "Hello there");
        full = run_answer(msgs, 900);
        json_decref(msgs);
        CHECK(full != NULL);
        if (!full) return;
    }
    type(t, "Hello there\r");
    CHECK(expect(t, "Hello there\n", 30) >= 0);
    size_t from = t->seen;
    double end = now() + 30;
    while (t->len < from + 8 && now() < end) term_read(t, 0.01);
    type(t, "\x03");
    long at = expect(t, "\n>>> ", 30);
    CHECK_MSG(at >= 0, "no prompt after Ctrl-C");
    if (at < 0) return;
    char *shown = strndup(t->buf + from, (size_t)at - from), *caret = strstr(shown, "^C");
    if (caret) memmove(caret, caret + 2, strlen(caret + 2) + 1); /* the terminal's echo */
    size_t n = strlen(shown);
    while (n && shown[n - 1] == '\n') shown[--n] = 0;
    /* A Ctrl-C makes the kernel drop what chat wrote and this side had not read yet (ISIG
     * without NOFLSH, which libedit clears), as a real terminal does: under load the screen
     * misses that one piece. So what shows must be run's answer from its start, at most one
     * piece left out, and end before run's answer does. */
    size_t p = 0;
    while (p < n && shown[p] == full[p]) p++;
    const char *rest = p < n ? strstr(full + p, shown + p) : full + p;
    size_t stop = rest ? (size_t)(rest - full) + (n - p) : 0;
    CHECK_MSG(p >= 8 && rest && stop < strlen(full),
              "Ctrl-C: shown %zu bytes '%s', the full answer has %zu and starts '%.*s'", n, shown,
              strlen(full), (int)(n + 16), full);
    CHECK_MSG(waitpid(t->pid, NULL, WNOHANG) == 0, "atlas chat ended on Ctrl-C");
    free(shown);
}

/* --- the cases ------------------------------------------------------------------------------ */

static void in_process(void) {
    term t;
    char *argv[] = {(char *)bin, "chat", "-m", (char *)model, "--device", "cpu", NULL};
    if (term_start(&t, argv)) {
        CHECK(0);
        return;
    }
    CHECK(expect(&t, ">>> ", 60) >= 0);
    CHECK(line(&t, "/set temp 0", "Set temp to 0."));
    CHECK(line(&t, "/set max 16", "Set max to 16."));
    json_t *msgs = json_array();
    check_turn(&t, msgs, "Hello there\r", "Hello there", "Hello there", 16);
    check_turn(&t, msgs, "And then?\r", "And then?", "And then?", 16); /* the history counts */
    CHECK(line(&t, "/system You speak of kings.", "Set the system prompt."));
    CHECK(line(&t, "/clear", "Cleared the conversation."));
    json_array_clear(msgs);
    add(msgs, "system", "You speak of kings.");
    check_turn(&t, msgs, "Hello there\r", "Hello there", "Hello there", 16);
    /* multi-line input: a trailing backslash, then a """ block */
    check_turn(&t, msgs, "first line\\\rsecond line\r", "second line", "first line\nsecond line",
               16);
    check_turn(&t, msgs, "\"\"\"\rone\rtwo\r\"\"\"\r", "two\n... \"\"\"", "one\ntwo", 16);
    CHECK(line(&t, "/system", "Removed the system prompt."));
    CHECK(line(&t, "/clear", "Cleared the conversation."));
    CHECK(line(&t, "/set max 900", "Set max to 900."));
    check_interrupt(&t);
    /* a typed line abandoned by Ctrl-C is not sent */
    type(&t, "never sent");
    CHECK(expect(&t, "never sent", 10) >= 0);
    size_t from = t.seen;
    type(&t, "\x03");
    long at = expect(&t, ">>> ", 10);
    CHECK_MSG(at >= 0 && (size_t)at - from <= 1, "an abandoned line was answered: '%s'",
              t.buf + from);
    CHECK(line(&t, "/sett", "did you mean '/set'?"));
    /* /load makes a new engine: the same model answers as before (/set stays) */
    char load[600];
    snprintf(load, sizeof load, "/load %s", model);
    CHECK(line(&t, "/clear", "Cleared the conversation."));
    CHECK(line(&t, load, "Loaded "));
    CHECK(line(&t, "/set max 16", "Set max to 16."));
    json_array_clear(msgs);
    check_turn(&t, msgs, "Hello there\r", "Hello there", "Hello there", 16);
    type(&t, "/bye\r");
    int rc = wait_exit(t.pid, 30);
    CHECK_MSG(rc == 0, "atlas chat exited %d on /bye", rc);
    close(t.fd);
    json_decref(msgs);
}

/* Starts `atlas serve --port 0` on the default model; its port, or 0. */
static int start_server(pid_t *pid) {
    int p[2];
    if (pipe(p)) return 0;
    *pid = fork();
    if (*pid == 0) {
        dup2(p[1], 2);
        close(p[0]);
        char spec[600];
        snprintf(spec, sizeof spec, "default=%s", model);
        execl(bin, bin, "serve", "--port", "0", "--model", spec, "--device", "cpu", NULL);
        _exit(127);
    }
    close(p[1]);
    char log[8192];
    size_t len = 0;
    int port = 0;
    double end = now() + 60;
    while (!port && now() < end && len + 1 < sizeof log) {
        struct pollfd q = {p[0], POLLIN, 0};
        if (poll(&q, 1, 100) <= 0) continue;
        ssize_t n = read(p[0], log + len, sizeof log - 1 - len);
        if (n <= 0) break;
        len += (size_t)n;
        log[len] = 0;
        char *m = strstr(log, "listening on http://");
        if (m) {
            char *colon = NULL;
            for (char *q2 = m + 20; *q2 && *q2 != ' ' && *q2 != '\n' && *q2 != '('; q2++)
                if (*q2 == ':') colon = q2;
            if (colon && colon[1] >= '0' && colon[1] <= '9') port = atoi(colon + 1);
        }
    }
    close(p[0]); /* the server's later log lines go nowhere (it ignores SIGPIPE) */
    if (!port) fprintf(stderr, "atlas serve did not start:\n%s\n", log);
    return port;
}

static void over_http(void) {
    pid_t server;
    int port = start_server(&server);
    CHECK(port > 0);
    if (!port) return;
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    term t;
    char *argv[] = {(char *)bin, "chat", "--url", url, "--model", "default", NULL};
    if (term_start(&t, argv)) {
        CHECK(0);
        return;
    }
    CHECK(expect(&t, ">>> ", 30) >= 0);
    CHECK(line(&t, "/set temp 0", "Set temp to 0."));
    CHECK(line(&t, "/set max 16", "Set max to 16."));
    json_t *msgs = json_array();
    check_turn(&t, msgs, "Hello there\r", "Hello there", "Hello there", 16);
    check_turn(&t, msgs, "And then?\r", "And then?", "And then?", 16);
    CHECK(line(&t, "/clear", "Cleared the conversation."));
    CHECK(line(&t, "/set max 900", "Set max to 900."));
    check_interrupt(&t);
    /* the server cancelled the stream it lost and answers the next turn */
    CHECK(line(&t, "/clear", "Cleared the conversation."));
    CHECK(line(&t, "/set max 16", "Set max to 16."));
    json_array_clear(msgs);
    check_turn(&t, msgs, "Hello there\r", "Hello there", "Hello there", 16);
    type(&t, "\x04"); /* Ctrl-D */
    int rc = wait_exit(t.pid, 30);
    CHECK_MSG(rc == 0, "atlas chat exited %d on Ctrl-D", rc);
    close(t.fd);
    json_decref(msgs);
    kill(server, SIGTERM);
    CHECK_MSG(wait_exit(server, 30) == 0, "atlas serve did not end cleanly on SIGTERM");
}

/* No terminal: lines in, answers alone out, one line each here. */
static void scripted(void) {
    json_t *msgs = json_array();
    add(msgs, "user", "Hello there");
    char *want = run_answer(msgs, 16), cmd[2048], out[8192];
    snprintf(cmd, sizeof cmd, "printf '/set temp 0\\n/set max 16\\nHello there\\n' | '%s' chat "
             "-m '%s' --device cpu 2>/dev/null", bin, model);
    int rc = harness_run(cmd, out, sizeof out);
    CHECK_MSG(rc == 0, "scripted chat exited %d", rc);
    size_t n = strlen(out);
    CHECK_MSG(want && n && out[n - 1] == '\n' && !strncmp(out, want, n - 1) &&
              strlen(want) == n - 1, "scripted chat printed '%s', run '%s'", out,
              want ? want : "");
    free(want);
    json_decref(msgs);
}

int main(void) {
    bin = getenv("ATLAS_BIN");
    const char *src = getenv("ATLAS_SOURCE_DIR");
    if (!bin || !src) {
        printf("SKIP: ATLAS_BIN and ATLAS_SOURCE_DIR are set by ctest\n");
        return 77;
    }
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/models/default", src);
    model = dir;
    if (!harness_mkdtemp(tmpdir, sizeof tmpdir, "chat")) return 1;
    CHECK_OK(atlas_template_load(model, &tmpl));
    if (tmpl) {
        double t0 = now();
        scripted();
        double t1 = now();
        in_process();
        double t2 = now();
        over_http();
        fprintf(stderr, "test-chat-pty: %.1f s (scripted %.1f, in process %.1f, --url %.1f)\n",
                now() - t0, t1 - t0, t2 - t1, now() - t2);
    }
    atlas_template_free(tmpl);
    harness_rm_rf(tmpdir);
    return harness_finish();
}
