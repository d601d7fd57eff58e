/* cli/options.h — what every subcommand says of an option it does not know: its name, and
 * the valid option nearest to it, so that a typo is told apart from a missing value. */
#ifndef ATLAS_CLI_OPTIONS_H
#define ATLAS_CLI_OPTIONS_H

/* 1 when arg is one of valid (a NULL-terminated list of spellings), else 0. */
int atlas_cli_known_option(const char *arg, const char *const *valid);

/* The spelling of valid that arg stands for: arg itself when valid has it; else the option
 * another tool's spelling means when it means the same (--max-tokens, --n-predict: -n;
 * --temperature: --temp; --prompt-file: --file; -c: --ctx-size; --max_tokens: --max-tokens,
 * as options.c lists them), when valid has it; else arg, which the caller then reports with
 * atlas_cli_unknown_option.  Returns arg or an entry of valid. */
const char *atlas_cli_resolve_option(const char *arg, const char *const *valid);

/* The entry of valid nearest to arg by edit distance, or NULL when none is near enough to
 * be the one meant (more than a third of its letters differ). */
const char *atlas_cli_nearest_option(const char *arg, const char *const *valid);

/* Prints "atlas CMD: unknown option 'ARG'; did you mean 'X'?" (or "(see --help)" when
 * nothing is near) on stderr and returns 2, the usage error's exit status.  A spelling of
 * another tool for what atlas does differently (--n-gpu-layers, -i in run) is answered with
 * what atlas does instead. */
int atlas_cli_unknown_option(const char *cmd, const char *arg, const char *const *valid);

#endif
