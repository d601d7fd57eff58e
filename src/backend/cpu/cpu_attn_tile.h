/* backend/cpu/cpu_attn_tile.h — the tiled attention of one item (a block of a sequence's
 * queries times one kv head's group of q heads), written once over a vector of VW floats:
 * cpu_attention.c includes it once per instruction set, after defining VW, VEC, TGT (the
 * target attribute), F(name) (the name with the set's suffix) and the v* operations.
 * Internal to backend/cpu; no include guard on purpose.
 *
 * Per block of KB keys: the keys and values are gathered from the paged cache as rows padded
 * to hdp floats; scores S = (q * scale) k^T, then the online softmax of each row (running
 * maximum m and sum l, the output rescaled when m grows), then O += P V. Rows are (token, head
 * of the group): the group's heads share each gathered block. */

#define KB (2 * VW)

/* e^x of each lane (Cephes' expf polynomial, about 1 ulp). Lanes under -87.3 give about
 * 1e-38: masked scores come out as that, nothing beside a row's sum of at least 1. */
TGT static inline VEC F(vexp)(VEC x) {
    x = vmin(vmax(x, vset1(-87.3f)), vset1(88.3f));
    VEC n = vround(vmul(x, vset1(1.44269504f)));
    VEC r = vfma(n, vset1(-0.693359375f), x);
    r = vfma(n, vset1(2.12194440e-4f), r);
    VEC y = vset1(1.9875691500e-4f);
    y = vfma(y, r, vset1(1.3981999507e-3f));
    y = vfma(y, r, vset1(8.3334519073e-3f));
    y = vfma(y, r, vset1(4.1665795894e-2f));
    y = vfma(y, r, vset1(1.6666665459e-1f));
    y = vfma(y, r, vset1(5.0000001201e-1f));
    y = vfma(y, vmul(r, r), vadd(r, vset1(1.0f)));
    return vmul(y, vpow2(n));
}

/* s[r][j] = q row r . key row k[j] for MR rows (a constant after inlining) and keys j < nk:
 * the lanes summed over the head's vectors in order from zero, then vhsum. Every score is
 * computed this one way, in the tiled path and in decode's direct one, so that a token's
 * logits are the same bits alone or in a batch. */
TGT __attribute__((always_inline)) static inline VEC F(kvload)(const void *row, int c,
                                                               const int BF, float sc) {
    if (BF == 2) return vmul(vloadfp8((const uint8_t *)row + c * VW), vset1(sc));
    return BF ? vloadbf((const uint16_t *)row + c * VW) : vload((const float *)row + c * VW);
}

/* BF (a constant after inlining): the key rows k[j] are fp32 (0), bf16 (1) or FP8 e4m3 codes
 * (2) times sc, widened as they load: an FP8 row is the value the gathered tiles hold (the
 * code's value times the scale, one rounding), so both paths score the same keys. */
TGT __attribute__((always_inline)) static inline void
F(score_rows)(const float *q, int hdp, const void *const *k, int nk, float *s, const int MR,
              const int BF, float sc) {
    const int nv = hdp / VW;
    for (int j = 0; j < nk; j++) {
        VEC a[4];
        for (int r = 0; r < MR; r++) a[r] = vzero();
        for (int c = 0; c < nv; c++) {
            VEC kv = F(kvload)(k[j], c, BF, sc);
            for (int r = 0; r < MR; r++) a[r] = vfma(vload(q + r * hdp + c * VW), kv, a[r]);
        }
        for (int r = 0; r < MR; r++) s[r * KB + j] = vhsum(a[r]);
    }
}

TGT __attribute__((always_inline)) static inline void
F(scores)(const float *qs, int M, int hdp, const void *const *k, int nk, float *s, const int BF,
          float sc) {
    int m = 0;
    for (; m + 4 <= M; m += 4) F(score_rows)(qs + m * hdp, hdp, k, nk, s + m * KB, 4, BF, sc);
    for (; m < M; m++) F(score_rows)(qs + m * hdp, hdp, k, nk, s + m * KB, 1, BF, sc);
    for (m = 0; m < M; m++)
        for (int j = nk; j < KB; j++) s[m * KB + j] = -INFINITY;
}

/* Each row's scores become its weights under the new running maximum; the row's sum and
 * output so far are rescaled to it. A row with nothing unmasked yet gets weights 0. */
TGT static void F(softmax)(float *s, int M, int hdp, float *o, float *mrow, float *lrow) {
    for (int m = 0; m < M; m++) {
        float *row = s + m * KB;
        VEC x0 = vload(row), x1 = vload(row + VW);
        float tmax = vhmax(vmax(x0, x1)), mold = mrow[m];
        float mnew = tmax > mold ? tmax : mold;
        if (mnew == -INFINITY) {
            vstore(row, vzero());
            vstore(row + VW, vzero());
            continue;
        }
        VEC mv = vset1(mnew);
        VEC p0 = F(vexp)(vsub(x0, mv)), p1 = F(vexp)(vsub(x1, mv));
        vstore(row, p0);
        vstore(row + VW, p1);
        float c = expf(mold - mnew); /* 0 when mold is -inf */
        lrow[m] = lrow[m] * c + vhsum(vadd(p0, p1));
        mrow[m] = mnew;
        if (c != 1.0f) {
            VEC cv = vset1(c);
            for (int d = 0; d < hdp; d += VW) vstore(o + m * hdp + d, vmul(vload(o + m * hdp + d), cv));
        }
    }
}

/* o[r][c*VW ..] += sum over j < nk of p[r][j] * vs[j][c*VW ..] for MR rows and ND vectors
 * of the head (constants after inlining). */
TGT __attribute__((always_inline)) static inline void
F(pv_rows)(const float *p, int nk, const float *vs, int hdp, float *o, const int MR,
           const int ND) {
    VEC a[4][4];
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < ND; c++) a[r][c] = vload(o + r * hdp + c * VW);
    for (int j = 0; j < nk; j++) {
        VEC v[4];
        for (int c = 0; c < ND; c++) v[c] = vload(vs + j * hdp + c * VW);
        for (int r = 0; r < MR; r++) {
            VEC pb = vset1(p[r * KB + j]);
            for (int c = 0; c < ND; c++) a[r][c] = vfma(pb, v[c], a[r][c]);
        }
    }
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < ND; c++) vstore(o + r * hdp + c * VW, a[r][c]);
}

TGT static void F(pv)(const float *s, int M, int nk, const float *vs, int hdp, float *o) {
    int nv = hdp / VW, m = 0;
    for (; m + 4 <= M; m += 4) {
        int c = 0;
        for (; c + 4 <= nv; c += 4)
            F(pv_rows)(s + m * KB, nk, vs + c * VW, hdp, o + m * hdp + c * VW, 4, 4);
        for (; c < nv; c++)
            F(pv_rows)(s + m * KB, nk, vs + c * VW, hdp, o + m * hdp + c * VW, 4, 1);
    }
    for (; m < M; m++) {
        int c = 0;
        for (; c + 4 <= nv; c += 4)
            F(pv_rows)(s + m * KB, nk, vs + c * VW, hdp, o + m * hdp + c * VW, 1, 4);
        for (; c < nv; c++)
            F(pv_rows)(s + m * KB, nk, vs + c * VW, hdp, o + m * hdp + c * VW, 1, 1);
    }
}

/* o[0 .. NC vectors) += sum over j < nk of p[j] * v[j][..] (NC a constant after inlining:
 * the accumulators stay in registers). */
TGT __attribute__((always_inline)) static inline void
F(pv_direct)(const float *p, int nk, const void *const *v, int c0, float *o, const int NC,
             const int BF, float sc) {
    VEC a[4];
    for (int x = 0; x < NC; x++) a[x] = vload(o + (c0 + x) * VW);
    for (int j = 0; j < nk; j++) {
        VEC pb = vset1(p[j]);
        for (int x = 0; x < NC; x++) a[x] = vfma(pb, F(kvload)(v[j], c0 + x, BF, sc), a[x]);
    }
    for (int x = 0; x < NC; x++) vstore(o + (c0 + x) * VW, a[x]);
}

/* The rows of keys j0 .. j0+nk-1 (kv head it->kvh) in the paged cache, by block and offset
 * counted up: cpu_kv_at's divisions, per key, cost as much as reading it. */
static inline void F(direct_rows)(const attn_item *it, int j0, int nk, const void **kp,
                                  const void **vp) {
    int blk = j0 / it->bs, in = j0 % it->bs;
    const size_t head = (size_t)it->kvh * it->bs * it->hd, es = cpu_kv_es(it->kv);
    for (int j = 0; j < nk; j++) {
        size_t off = ((size_t)it->table[blk] * it->kv->stride + head + (size_t)in * it->hd) * es;
        kp[j] = (const char *)it->k + off;
        vp[j] = (const char *)it->v + off;
        if (++in == it->bs) in = 0, blk++;
    }
}

/* Decode's item (one token, hd a whole number of vectors, at most 8 q heads): each key's
 * row is read in place from the paged cache, scored against every q head of the group with
 * a dot product, and each value row added in place, where a block of keys would be gathered
 * and transposed first (that copy cost more than the products for one query). The same
 * online softmax over blocks of KB keys as the tiled path. */
TGT __attribute__((always_inline)) static inline void
F(attn_direct_t)(const attn_item *it, float *buf, const int BF) {
    const int hd = it->hd, M = it->group, nv = hd / VW;
    float *qs = buf, *o = qs + (size_t)M * hd, *s = o + (size_t)M * hd, *mrow = s + (size_t)M * KB;
    float *lrow = mrow + M;
    const void *kp[2][KB], *vp[2][KB];
    attn_load_q(it, qs, hd, o, mrow, lrow);
    const int pos = it->pos0, first = attn_first_key(it, pos);
    int cur = 0;
    F(direct_rows)(it, first, pos + 1 - first < KB ? pos + 1 - first : KB, kp[0], vp[0]);
    for (int j0 = first; j0 <= pos; j0 += KB, cur ^= 1) {
        int nk = pos + 1 - j0 < KB ? pos + 1 - j0 : KB;
        int j1 = j0 + KB, nk1 = pos + 1 - j1 < KB ? pos + 1 - j1 : KB;
        if (j1 <= pos) F(direct_rows)(it, j1, nk1, kp[cur ^ 1], vp[cur ^ 1]);
        const void *const *vc = vp[cur];
        F(scores)(qs, M, hd, kp[cur], nk, s, BF, it->k_scale);
        F(softmax)(s, M, hd, o, mrow, lrow);
        for (int m = 0; m < M; m++) {
            int c = 0;
            for (; c + 4 <= nv; c += 4)
                F(pv_direct)(s + m * KB, nk, vc, c, o + (size_t)m * hd, 4, BF, it->v_scale);
            for (; c < nv; c++)
                F(pv_direct)(s + m * KB, nk, vc, c, o + (size_t)m * hd, 1, BF, it->v_scale);
        }
    }
    attn_store(it, o, hd, lrow);
}

TGT static void F(attn_direct)(const attn_item *it, float *buf) {
    if (it->kv->fp8) F(attn_direct_t)(it, buf, 2);
    else if (it->kv->bf16) F(attn_direct_t)(it, buf, 1);
    else F(attn_direct_t)(it, buf, 0);
}

/* One item into its output rows; buf: attn_buf_floats(rows, hd) floats. */
TGT static void F(attn_item)(const attn_item *it, float *buf) {
    if (it->nq == 1 && it->hd % VW == 0 && it->group <= 8) {
        F(attn_direct)(it, buf);
        return;
    }
    const int hd = it->hd, hdp = (hd + VW - 1) / VW * VW, M = it->nq * it->group;
    float *qs = buf, *o = qs + (size_t)M * hdp, *s = o + (size_t)M * hdp;
    float *ks = s + (size_t)M * KB, *vs = ks + (size_t)KB * hdp, *mrow = vs + (size_t)KB * hdp;
    float *lrow = mrow + M;
    const void *kr[KB];
    for (int j = 0; j < KB; j++) kr[j] = ks + (size_t)j * hdp;
    attn_load_q(it, qs, hdp, o, mrow, lrow);
    int hi = it->pos0 + it->nq - 1;
    for (int j0 = attn_first_key(it, it->pos0); j0 <= hi; j0 += KB) {
        int nk = hi + 1 - j0 < KB ? hi + 1 - j0 : KB;
        attn_gather(it, j0, nk, ks, vs, hdp);
        F(scores)(qs, M, hdp, kr, nk, s, 0, 1.0f);
        attn_mask(it, j0, KB, s);
        F(softmax)(s, M, hdp, o, mrow, lrow);
        F(pv)(s, M, nk, vs, hdp, o);
    }
    attn_store(it, o, hdp, lrow);
}

#undef KB
