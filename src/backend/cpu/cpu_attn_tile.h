/* backend/cpu/cpu_attn_tile.h — the tiled attention of one item (a block of a sequence's
 * queries times one kv head's group of q heads), written once over a vector of VW floats:
 * cpu_attention.c includes it once per instruction set, after defining VW, VEC, TGT (the
 * target attribute), F(name) (the name with the set's suffix) and the v* operations.
 * Internal to backend/cpu; no include guard on purpose.
 *
 * Per block of KB keys: the keys are gathered from the paged cache transposed (kt[d][j]) and
 * the values as rows padded to hdp floats, so both products run along contiguous vectors;
 * scores S = (q * scale) k^T, then the online softmax of each row (running maximum m and
 * sum l, the output rescaled when m grows), then O += P V. Rows are (token, head of the
 * group): the group's heads share each gathered block. */

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

/* s[r][0..KB) = q row r . kt for MR rows (a constant after inlining: the 2 x MR
 * accumulators stay in registers). */
TGT __attribute__((always_inline)) static inline void
F(score_rows)(const float *q, int hdp, int hd, const float *kt, float *s, const int MR) {
    VEC a[4][2];
    for (int r = 0; r < MR; r++) a[r][0] = a[r][1] = vzero();
    for (int d = 0; d < hd; d++) {
        VEC k0 = vload(kt + d * KB), k1 = vload(kt + d * KB + VW);
        for (int r = 0; r < MR; r++) {
            VEC qb = vset1(q[r * hdp + d]);
            a[r][0] = vfma(qb, k0, a[r][0]);
            a[r][1] = vfma(qb, k1, a[r][1]);
        }
    }
    for (int r = 0; r < MR; r++) {
        vstore(s + r * KB, a[r][0]);
        vstore(s + r * KB + VW, a[r][1]);
    }
}

TGT static void F(scores)(const float *qs, int M, int hdp, int hd, const float *kt, float *s) {
    int m = 0;
    for (; m + 4 <= M; m += 4) F(score_rows)(qs + m * hdp, hdp, hd, kt, s + m * KB, 4);
    for (; m < M; m++) F(score_rows)(qs + m * hdp, hdp, hd, kt, s + m * KB, 1);
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

/* One item into its output rows; buf: attn_buf_floats(rows, hd) floats. */
TGT static void F(attn_item)(const attn_item *it, float *buf) {
    const int hd = it->hd, hdp = (hd + VW - 1) / VW * VW, M = it->nq * it->group;
    float *qs = buf, *o = qs + (size_t)M * hdp, *s = o + (size_t)M * hdp;
    float *kt = s + (size_t)M * KB, *vs = kt + (size_t)hd * KB, *mrow = vs + (size_t)KB * hdp;
    float *lrow = mrow + M;
    attn_load_q(it, qs, hdp, o, mrow, lrow);
    int hi = it->pos0 + it->nq - 1;
    for (int j0 = attn_first_key(it, it->pos0); j0 <= hi; j0 += KB) {
        int nk = hi + 1 - j0 < KB ? hi + 1 - j0 : KB;
        attn_gather(it, j0, nk, KB, kt, vs, hdp);
        F(scores)(qs, M, hdp, hd, kt, s);
        attn_mask(it, j0, KB, s);
        F(softmax)(s, M, hdp, o, mrow, lrow);
        F(pv)(s, M, nk, vs, hdp, o);
    }
    attn_store(it, o, hdp, lrow);
}

#undef KB
