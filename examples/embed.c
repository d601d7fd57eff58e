/* examples/embed.c — atlas embedded in a program, through the public API and libatlas.so:
 * an engine on one model directory, one prompt, the text printed as it streams.
 *     example-embed [MODEL_DIR] [PROMPT]      (default: models/default, "In the beginning") */
#include <atlas/atlas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { pthread_mutex_t mu; pthread_cond_t cv; int done; atlas_event end; } reply;

/* Runs on the engine's scheduler thread: print, and on END wake main(). */
static void on_event(const atlas_event *ev, void *user) {
    reply *r = user;
    fwrite(ev->text, 1, ev->text_len, stdout);
    fflush(stdout);
    if (ev->type != ATLAS_EVENT_END) return;
    if (ev->finish == ATLAS_FINISH_ERROR) fprintf(stderr, "\natlas: %s\n", ev->message);
    pthread_mutex_lock(&r->mu);
    r->end = *ev, r->done = 1; /* (ev's strings die with the call: only numbers are read) */
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "models/default";
    const char *prompt = argc > 2 ? argv[2] : "In the beginning";
    if (strcmp(atlas_version(), ATLAS_VERSION_STRING))
        fprintf(stderr, "note: headers %s, library %s\n", ATLAS_VERSION_STRING, atlas_version());
    atlas_engine_model model = {.name = "default", .dir = dir};
    atlas_engine_params p = atlas_engine_default_params();
    p.models = &model, p.n_models = 1, p.parallel = 1;
    atlas_engine *e = NULL;
    const atlas_tokenizer *tok = NULL; /* the engine's: not ours to free */
    int32_t *ids = NULL;
    size_t n = 0;
    reply r = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, {0}};
    atlas_request req = {.model = "default", .sampling = atlas_sampler_default_params(),
                         .max_tokens = 24};
    req.sampling.temperature = 0; /* greedy */
    atlas_status st = atlas_engine_create(&p, &e);
    if (st == ATLAS_OK) st = atlas_engine_tokenizer(e, "default", &tok);
    if (st == ATLAS_OK) st = atlas_tokenizer_encode(tok, prompt, strlen(prompt), true, &ids, &n);
    req.prompt = ids, req.n_prompt = n;
    printf("%s", prompt);
    if (st == ATLAS_OK) st = atlas_engine_submit(e, &req, on_event, &r, NULL);
    if (st != ATLAS_OK) {
        fprintf(stderr, "\natlas: %s: %s\n", atlas_status_str(st), atlas_last_error());
    } else {
        pthread_mutex_lock(&r.mu);
        while (!r.done) pthread_cond_wait(&r.cv, &r.mu);
        pthread_mutex_unlock(&r.mu);
        static const char *const why[] = {"stop", "length", "cancelled", "error"};
        printf("\n[finish: %s, prompt %d tokens, generated %d]\n", why[r.end.finish],
               r.end.usage.prompt_tokens, r.end.usage.completion_tokens);
        if (r.end.finish == ATLAS_FINISH_ERROR) st = r.end.status;
    }
    free(ids);
    atlas_engine_free(e);
    return st == ATLAS_OK ? 0 : 1;
}
