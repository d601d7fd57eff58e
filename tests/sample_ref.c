/* tests/sample_ref.c — see sample_ref.h. */
#include "sample_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct rc {
    double y;
    int id;
} rc;

/* Larger value first, then the lower id (the order top-k and top-p keep a prefix of). */
static int rc_cmp(const void *a, const void *b) {
    const rc *x = a, *y = b;
    if (x->y != y->y) return x->y > y->y ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The adjusted logits (bias, penalties) into l[vocab]. */
static void adjusted(const float *logits, int vocab, const atlas_sample_row *q,
                     const atlas_sample_adj *adj, double *l) {
    for (int i = 0; i < vocab; i++) l[i] = logits[i];
    for (int j = 0; j < q->n_adj; j++) {
        const atlas_sample_adj *a = &adj[q->adj0 + j];
        double v = l[a->id] + a->bias;
        if (a->seen) v = v > 0 ? v / q->repetition_penalty : v * q->repetition_penalty;
        if (a->count > 0) v -= q->presence_penalty + q->frequency_penalty * a->count;
        l[a->id] = v;
    }
}

/* Marks the ids that float32 arithmetic may put on either side of a threshold: top-k's
 * value (relative 1e-6), top-p's mass before an id (within 1e-4) and min-p's ratio (relative
 * 1e-4). */
static void mark_unsure(const rc *c, int vocab, int k, const double *cum_before,
                        const atlas_sample_row *q, unsigned char *unsure) {
    for (int i = 0; i < vocab; i++) {
        const rc *r = &c[i];
        double w = exp(r->y - c[0].y);
        int u = 0;
        if (k < vocab) u |= fabs(r->y - c[k - 1].y) <= 1e-6 * fmax(1, fabs(c[k - 1].y));
        if (q->top_p < 1 && i < k) u |= fabs(cum_before[i] - q->top_p) <= 1e-4;
        if (q->min_p > 0) u |= fabs(w - q->min_p) <= 1e-4 * q->min_p;
        unsure[r->id] = (unsigned char)u;
    }
}

int sref_dist(const float *logits, int vocab, const atlas_sample_row *q,
              const atlas_sample_adj *adj, double *p, unsigned char *unsure) {
    double *l = malloc((size_t)vocab * sizeof *l), *cum = malloc((size_t)vocab * sizeof *cum);
    rc *c = malloc((size_t)vocab * sizeof *c);
    int kept = -1;
    if (!l || !c || !cum) goto out;
    adjusted(logits, vocab, q, adj, l);
    for (int i = 0; i < vocab; i++) {
        p[i] = 0;
        c[i] = (rc){q->temperature > 0 ? l[i] / q->temperature : l[i], i};
    }
    qsort(c, (size_t)vocab, sizeof *c, rc_cmp);
    if (unsure) memset(unsure, 0, (size_t)vocab);
    if (q->temperature == 0) {
        p[c[0].id] = 1;
        kept = 1;
        goto out;
    }
    int n = q->top_k > 0 && q->top_k < vocab ? q->top_k : vocab, k = n;
    double z = 0, run = 0;
    for (int i = 0; i < n; i++) z += exp(c[i].y - c[0].y);
    for (int i = 0; i < n; i++) { /* top-p: the smallest prefix with mass >= top_p */
        cum[i] = run;
        run += exp(c[i].y - c[0].y) / z;
        if (q->top_p < 1 && run >= q->top_p && n == k) n = i + 1;
    }
    if (unsure) mark_unsure(c, vocab, k, cum, q, unsure);
    double sum = 0;
    kept = 0;
    for (int i = 0; i < n; i++) { /* min-p: p >= min_p * p_max, p_max = exp(0) / z */
        double w = exp(c[i].y - c[0].y);
        if (w < q->min_p) continue;
        p[c[i].id] = w;
        sum += w;
        kept++;
    }
    for (int i = 0; i < vocab; i++) p[i] /= sum;
out:
    free(l);
    free(c);
    free(cum);
    return kept;
}

void sref_log_softmax(const float *logits, int vocab, double *lp) {
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < vocab; i++) s += exp(logits[i] - mx);
    double lse = mx + log(s);
    for (int i = 0; i < vocab; i++) lp[i] = logits[i] - lse;
}

double sref_gamma_q(double a, double x) {
    if (x <= 0) return 1;
    double lg = a * log(x) - x - lgamma(a);
    if (x < a + 1) { /* P by its series, Q = 1 - P */
        double term = 1 / a, sum = term;
        for (int n = 1; n < 100000 && fabs(term) > fabs(sum) * 1e-16; n++) {
            term *= x / (a + n);
            sum += term;
        }
        return 1 - sum * exp(lg);
    }
    double b = x + 1 - a, c = 1e300, d = 1 / b, h = d; /* modified Lentz */
    for (int i = 1; i < 100000; i++) {
        double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        if (fabs(d) < 1e-300) d = 1e-300;
        c = b + an / c;
        if (fabs(c) < 1e-300) c = 1e-300;
        d = 1 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1) < 1e-16) break;
    }
    return exp(lg) * h;
}

static double term(double o, double e) { return (o - e) * (o - e) / e; }

double sref_chi2(const long *obs, const double *p, int n, long n_draws, double *stat, int *dof) {
    double chi = 0, pe = 0, po = 0, last_e = 0, last_o = 0; /* last: the last bin closed */
    int bins = 0;
    for (int i = 0; i < n; i++) {
        double e = p[i] * (double)n_draws, o = (double)obs[i];
        if (e <= 0) continue;
        if (e < 5) { /* into the open pool, closed once it expects 5 */
            pe += e;
            po += o;
            if (pe < 5) continue;
            e = pe, o = po;
            pe = po = 0;
        }
        chi += term(o, e);
        last_e = e, last_o = o;
        bins++;
    }
    if (pe > 0 && bins > 0) { /* a short last pool joins the last bin */
        chi += term(last_o + po, last_e + pe) - term(last_o, last_e);
    } else if (pe > 0) {
        bins = 1; /* everything in one short pool: no test */
    }
    *stat = chi;
    *dof = bins - 1;
    return bins > 1 ? sref_gamma_q(0.5 * (bins - 1), 0.5 * chi) : 1.0;
}

const char *const sref_case_name[SREF_CASES] = {"temperature", "top-k", "top-p", "min-p",
                                                "penalties", "logit_bias", "combined",
                                                "greedy"};

static int adj_cmp(const void *a, const void *b) {
    const atlas_sample_adj *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

void sref_case(int i, const int32_t top[8], atlas_sample_row *q, atlas_sample_adj adj[8]) {
    *q = (atlas_sample_row){.temperature = 1, .top_p = 1, .repetition_penalty = 1,
                            .flags = ATLAS_SAMPLE_LOGPROB, .n_top = 5};
    int n = 0;
    switch (i) {
    case 0: q->temperature = 0.7f; break;
    case 1: q->top_k = 40; break;
    case 2: q->top_p = 0.8f; break;
    case 3: q->min_p = 0.05f; break;
    case 4: case 7: /* a prompt token, generated ones, one of them three times */
        q->repetition_penalty = 1.3f, q->presence_penalty = 0.5f, q->frequency_penalty = 0.25f;
        adj[n++] = (atlas_sample_adj){top[0], 1, 3, 0};
        adj[n++] = (atlas_sample_adj){top[1], 1, 0, 0};
        adj[n++] = (atlas_sample_adj){top[2], 1, 1, 0};
        adj[n++] = (atlas_sample_adj){top[7], 1, 2, 0};
        if (i == 7) q->temperature = 0;
        break;
    case 5: /* the largest banned, one of the head raised */
        adj[n++] = (atlas_sample_adj){top[0], 0, 0, -100};
        adj[n++] = (atlas_sample_adj){top[5], 0, 0, 2.5f};
        break;
    default:
        q->temperature = 0.8f, q->top_k = 200, q->top_p = 0.9f, q->min_p = 0.01f;
        q->repetition_penalty = 1.2f, q->presence_penalty = 0.3f, q->frequency_penalty = 0.2f;
        adj[n++] = (atlas_sample_adj){top[0], 1, 2, 0};
        adj[n++] = (atlas_sample_adj){top[3], 0, 0, 1.5f};
        adj[n++] = (atlas_sample_adj){top[6], 1, 0, -0.5f};
        break;
    }
    qsort(adj, (size_t)n, sizeof *adj, adj_cmp);
    q->n_adj = n;
}

void sref_top8(const float *x, int n, int32_t top[8]) {
    int have = 0;
    for (int i = 0; i < n; i++) {
        if (have == 8 && !(x[i] > x[top[7]])) continue;
        int j = have < 8 ? have++ : 7;
        while (j > 0 && x[i] > x[top[j - 1]]) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = i;
    }
}
