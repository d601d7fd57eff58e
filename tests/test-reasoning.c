/* tests/test-reasoning.c — the "<think>" splitter (atlas/reasoning.h): each case fed
 * whole, at every split into two pieces, and byte by byte, must give the same reasoning and
 * content; and nothing is released early that a later byte could change. */
#include <stdlib.h>
#include <string.h>

#include "atlas/reasoning.h"
#include "harness.h"

typedef struct rcase {
    bool inside;
    const char *text, *reasoning, *content;
} rcase;

static const rcase cases[] = {
    {false, "<think>\nI think.\n</think>\n\nHello!", "I think.", "Hello!"},
    {false, "  \n<think>a</think>b", "a", "b"},
    {false, "Hello <think>x</think>", "", "Hello <think>x</think>"},
    {false, "<think>\nstill thinking  \n", "still thinking", ""},
    {false, "<thi", "", "<thi"},
    {false, "<think></think>", "", ""},
    {false, "<think>a </thinx b</think>c", "a </thinx b", "c"},
    {false, "", "", ""},
    {false, "<think>a</think>b<think>c</think>", "a", "b<think>c</think>"},
    {false, "<think>\xc3\xa9 \xe4\xb8\xad</think>\xc3\xbc", "\xc3\xa9 \xe4\xb8\xad", "\xc3\xbc"},
    {false, "<think>x</think>  spaced  out  ", "x", "spaced  out  "},
    {false, "<thinking>no</thinking>", "", "<thinking>no</thinking>"},
    {false, "<think>a\n\n</think", "a\n\n</think", ""},
    {true, "\nreason\n</think>\n\nanswer", "reason", "answer"},
    {true, "abc", "abc", ""},
    {true, "</think>only content", "", "only content"},
    {true, "a</think></think>", "a", "</think>"},
};

/* Feeds text in pieces cut at cuts[0..n_cuts) (increasing) and joins what comes out. */
static void run(const rcase *c, const size_t *cuts, int n_cuts, char *r_out, char *c_out) {
    atlas_reasoning *r = NULL;
    r_out[0] = c_out[0] = '\0';
    CHECK_OK(atlas_reasoning_new(c->inside, &r));
    if (!r) return;
    size_t len = strlen(c->text), at = 0;
    for (int i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        bool end = i == n_cuts;
        char *a = NULL, *b = NULL;
        CHECK_OK(atlas_reasoning_feed(r, c->text + at, to - at, end, &a, &b));
        if (a) strcat(r_out, a);
        if (b) strcat(c_out, b);
        free(a);
        free(b);
        at = to;
    }
    atlas_reasoning_free(r);
}

static void test_cases(void) {
    char r_out[256], c_out[256];
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const rcase *c = &cases[k];
        size_t len = strlen(c->text);
        run(c, NULL, 0, r_out, c_out);
        CHECK_MSG(!strcmp(r_out, c->reasoning) && !strcmp(c_out, c->content),
                  "case %zu whole: reasoning '%s' content '%s'", k, r_out, c_out);
        for (size_t cut = 0; cut <= len; cut++) {
            run(c, &cut, 1, r_out, c_out);
            CHECK_MSG(!strcmp(r_out, c->reasoning) && !strcmp(c_out, c->content),
                      "case %zu cut at %zu: reasoning '%s' content '%s'", k, cut, r_out, c_out);
        }
        size_t cuts[64];
        for (size_t i = 0; i < len && i < 64; i++) cuts[i] = i + 1;
        run(c, cuts, (int)(len < 64 ? len : 64), r_out, c_out);
        CHECK_MSG(!strcmp(r_out, c->reasoning) && !strcmp(c_out, c->content),
                  "case %zu byte by byte: reasoning '%s' content '%s'", k, r_out, c_out);
    }
}

/* What is released before the end must already be final: reasoning text released while
 * streaming never carries a tag's first bytes. */
static void test_holding(void) {
    atlas_reasoning *r = NULL;
    CHECK_OK(atlas_reasoning_new(false, &r));
    if (!r) return;
    char *a, *b;
    CHECK_OK(atlas_reasoning_feed(r, "<think>abc </th", 15, false, &a, &b));
    CHECK(a && !strcmp(a, "abc") && b && !strcmp(b, ""));
    free(a), free(b);
    CHECK_OK(atlas_reasoning_feed(r, "ink>\n\nHi", 8, false, &a, &b));
    CHECK(a && !strcmp(a, "") && b && !strcmp(b, "Hi"));
    free(a), free(b);
    atlas_reasoning_free(r);
    CHECK_OK(atlas_reasoning_new(false, &r));
    CHECK_OK(atlas_reasoning_feed(r, " <th", 4, false, &a, &b)); /* may still open */
    CHECK(a && !strcmp(a, "") && b && !strcmp(b, ""));
    free(a), free(b);
    CHECK_OK(atlas_reasoning_feed(r, "ank you", 7, false, &a, &b)); /* it did not */
    CHECK(a && !strcmp(a, "") && b && !strcmp(b, " <thank you"));
    free(a), free(b);
    atlas_reasoning_free(r);
    atlas_reasoning_free(NULL);
}

static void test_detection(void) {
    CHECK(atlas_reasoning_prompt_open("<|im_start|>assistant\n<think>\n"));
    CHECK(atlas_reasoning_prompt_open("<think>"));
    CHECK(!atlas_reasoning_prompt_open("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    CHECK(!atlas_reasoning_prompt_open("<|im_start|>assistant\n"));
    CHECK(!atlas_reasoning_prompt_open(""));
    CHECK(!atlas_reasoning_prompt_open(NULL));
    CHECK(atlas_reasoning_template_thinks("{{ '<think>\\n\\n</think>' }}"));
    CHECK(!atlas_reasoning_template_thinks("{{ messages }}"));
    CHECK(!atlas_reasoning_template_thinks(NULL));
}

int main(void) {
    test_cases();
    test_holding();
    test_detection();
    return harness_finish();
}
