/* tests/sample_ref.h — what the sample op (backend.h) should draw from, computed in float64
 * from the published definitions (atlas/sampler.h's order: logit_bias, HF's repetition
 * penalty, OpenAI's presence and frequency penalties, temperature, top-k, top-p, min-p),
 * and Pearson's chi-square test of draws against it.  Written apart from both samplers so
 * that either can be held to it (test-sample-op on the CPU, test-gpu-sample on the GPU). */
#ifndef ATLAS_TEST_SAMPLE_REF_H
#define ATLAS_TEST_SAMPLE_REF_H

#include "backend/backend.h"

/* p[vocab]: the probability of each id when row q (adjustments adj[q->adj0 ..]) samples the
 * raw logits[vocab]; temperature 0: 1 at the argmax of the adjusted row (lowest id on ties).
 * unsure[vocab] (NULL: not wanted): 1 for the ids so near a threshold (top-k, top-p, min-p)
 * that float32 arithmetic may keep or drop them. Returns the support's size, or -1 out of
 * memory. */
int sref_dist(const float *logits, int vocab, const atlas_sample_row *q,
              const atlas_sample_adj *adj, double *p, unsigned char *unsure);

/* The configurations both sampler tests draw with, on a row whose largest logits are its
 * ids top[0], top[1], ... (top[8]): temperature; top-k; top-p; min-p; the penalties; logit_bias;
 * all of them; greedy with penalties.  Row i's adjustments are adj[8 i ..]. */
enum { SREF_CASES = 8 };
extern const char *const sref_case_name[SREF_CASES];
void sref_case(int i, const int32_t top[8], atlas_sample_row *q, atlas_sample_adj adj[8]);

/* The ids of the 8 largest of x[n] (ties: the lower id), largest first. */
void sref_top8(const float *x, int n, int32_t top[8]);

/* lp[vocab]: the log-softmax of the raw logits, in float64. */
void sref_log_softmax(const float *logits, int vocab, double *lp);

/* Q(a, x) = Gamma(a, x) / Gamma(a): the upper regularized incomplete gamma function (series
 * below a + 1, Lentz's continued fraction above). */
double sref_gamma_q(double a, double x);

/* Pearson's chi-square of counts obs[n] (n_draws in all) against probabilities p[n]: ids
 * whose expected count is 5 or more are bins of their own, the others are pooled in id order
 * into bins of at least 5 (a last short pool joins the one before).  Its statistic and
 * degrees of freedom into *stat and *dof; returns the p-value (1 with no degree of freedom). */
double sref_chi2(const long *obs, const double *p, int n, long n_draws, double *stat, int *dof);

#endif
