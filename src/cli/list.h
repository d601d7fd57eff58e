/* cli/list.h — the comma-separated values of command-line options: `atlas run --prompt-ids
 * 1,2,3`, `atlas bench -p 512,2048 --batch 8,32 --skip-ops rope,norm`. Apart from the
 * commands so that a fuzz target (fuzz/fuzz-cli-list.c) reaches them. None prints. */
#ifndef ATLAS_CLI_LIST_H
#define ATLAS_CLI_LIST_H

#include <stddef.h>
#include <stdint.h>

/* "1,2,3": token ids, each 0..INT32_MAX, into *ids (malloc'd, the caller frees it; NULL
 * when there is none) and *n. 0 on success; -1 at a bad id (*bad points at it in s; *ids
 * is freed and NULL); 1 out of memory. */
int atlas_cli_parse_ids(const char *s, int32_t **ids, size_t *n, const char **bad);

/* "512,2048" into out[0, max), each as atoi reads it but clamped to int (the caller checks
 * their range); returns how many. */
int atlas_cli_parse_ints(const char *v, int *out, int max);

/* "attention,norm": bit i set for each names[i] listed; -1 for a name not among them or
 * when n_names is over 31. */
int atlas_cli_parse_names(const char *v, const char *const *names, int n_names);

#endif
