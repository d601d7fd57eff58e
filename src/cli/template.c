/* cli/template.c — `atlas template -m DIR [--no-generation-prompt] [--tools FILE]
 * [--kwargs JSON] MESSAGES|-`: prints the prompt that the model's chat template renders for
 * a conversation, exactly (no newline is added). MESSAGES is a JSON file holding the OpenAI
 * "messages" array, or a chat-completion request object with "messages" (and "tools"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "atlas/template.h"
#include "atlas/toolcall.h"
#include "cli/cli.h"
#include "cli/default_model.h"
#include "cli/options.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: atlas template [-m DIR] [--no-generation-prompt] [--tools FILE] [--kwargs JSON] MESSAGES|-\n"
            "  Prints the prompt the model's chat template renders for MESSAGES, a JSON file with the\n"
            "  OpenAI messages array (or a request object with \"messages\" and \"tools\"); '-' reads stdin.\n"
            "  Tool-call arguments may be objects or JSON strings.\n"
            "  -m, --model DIR          model directory with tokenizer_config.json (default %s)\n"
            "  --no-generation-prompt   render without add_generation_prompt\n"
            "  --tools FILE             JSON file with the \"tools\" array\n"
            "  --kwargs JSON            extra template variables, e.g. '{\"enable_thinking\": false}';\n"
            "                           not messages, tools, the special tokens or a builtin\n"
            "  --tool-format            print the tool-call format the server would parse, and exit\n"
            "  -h, --help               this help\n",
            atlas_cli_default_model());
}

static json_t *load(const char *what, const char *path) {
    json_error_t err;
    json_t *j = !strcmp(path, "-") ? json_loadf(stdin, JSON_DECODE_ANY, &err) : json_load_file(path, JSON_DECODE_ANY, &err);
    if (!j && err.line < 0) fprintf(stderr, "atlas template: %s: %s\n", what, err.text);
    else if (!j) fprintf(stderr, "atlas template: %s %s:%d:%d: %s\n", what, !strcmp(path, "-") ? "<stdin>" : path, err.line, err.column, err.text);
    return j;
}

typedef struct opts {
    const char *dir, *messages, *tools, *kwargs;
    bool gen, tool_format;
} opts;

static const char *const template_options[] = {"-h", "--help", "-m", "--model", "--tools",
                                               "--kwargs", "--no-generation-prompt",
                                               "--tool-format", NULL};

/* 0 ok, 1 done (help), 2 usage error */
static int parse_args(int argc, char **argv, opts *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = atlas_cli_resolve_option(argv[i], template_options);
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--tools") || !strcmp(a, "--kwargs")) {
            if (++i == argc) {
                fprintf(stderr, "atlas template: %s needs a value\n", a);
                return 2;
            }
            if (a[1] == 'm' || a[2] == 'm') o->dir = argv[i];
            else if (a[2] == 't') o->tools = argv[i];
            else o->kwargs = argv[i];
        } else if (!strcmp(a, "--no-generation-prompt")) {
            o->gen = false;
        } else if (!strcmp(a, "--tool-format")) {
            o->tool_format = true;
        } else if (a[0] == '-' && a[1] != '\0') {
            return atlas_cli_unknown_option("template", a, template_options);
        } else if (o->messages) {
            fprintf(stderr, "atlas template: one MESSAGES file only (see --help)\n");
            return 2;
        } else {
            o->messages = a;
        }
    }
    if (!o->messages && !o->tool_format) {
        fprintf(stderr, "atlas template: missing MESSAGES (a JSON file, or '-' for stdin) (see --help)\n");
        return 2;
    }
    if (!o->dir) o->dir = atlas_cli_default_model();
    return 0;
}

static int render(const atlas_template *t, const opts *o) {
    json_t *msgs = load("messages", o->messages), *tools = NULL, *kw = NULL;
    int rc = 1;
    if (!msgs) return 1;
    json_t *list = msgs;
    if (json_is_object(msgs)) { /* a request body */
        list = json_object_get(msgs, "messages");
        if (!o->tools) tools = json_incref(json_object_get(msgs, "tools"));
    }
    if (o->tools && !(tools = load("tools", o->tools))) goto done;
    if (o->kwargs) {
        json_error_t err;
        if (!(kw = json_loads(o->kwargs, 0, &err))) {
            fprintf(stderr, "atlas template: --kwargs:%d:%d: %s\n", err.line, err.column, err.text);
            goto done;
        }
    }
    atlas_template_input in = {.messages = list, .tools = tools, .kwargs = kw, .add_generation_prompt = o->gen};
    char *out = NULL;
    if (atlas_template_render(t, &in, &out) != ATLAS_OK) {
        fprintf(stderr, "atlas template: %s\n", atlas_last_error());
        goto done;
    }
    fputs(out, stdout);
    free(out);
    rc = fflush(stdout) ? 1 : 0;
done:
    json_decref(msgs);
    json_decref(tools);
    json_decref(kw);
    return rc;
}

int atlas_cli_template(int argc, char **argv) {
    opts o = {.gen = true};
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    atlas_template *t = NULL;
    if (atlas_template_load(o.dir, &t) != ATLAS_OK) {
        fprintf(stderr, "atlas template: %s\n", atlas_last_error());
        return 1;
    }
    if (o.tool_format) {
        /* as the server decides it (server/api.c): from the template, else from config.json's
         * architecture, so that what this prints is what a request would get */
        json_t *cfg = atlas_cli_model_json(o.dir, "config.json");
        const char *arch =
            json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0));
        printf("%s\n", atlas_toolcall_format_name(
                           atlas_toolcall_format_detect(atlas_template_source(t), arch)));
        json_decref(cfg);
        rc = 0;
    } else {
        rc = render(t, &o);
    }
    atlas_template_free(t);
    return rc;
}
