/*
 * fat_cpu_kernel.h - tile kernels of the CPU path, a template: fat_cpu.c
 * includes it twice, with REAL = float (float32/float16/bfloat16 inputs) and
 * REAL = double (float64 inputs), FAT_T(name) adding a suffix.  Not a public
 * header; no include guard on purpose.
 *
 * Tiles (per thread, O(tile x head_dim)):
 *   forward : q (BQ x d), kt (d x BK, K transposed), v (BK x dv),
 *             s (BQ x BK) scores/probabilities, acc (BQ x dv), m, l (BQ).
 *   backward: k, kt, v, vt, dk/dv accumulators of one key block, and q, dout,
 *             s (P), dp (dP then dS), dt (softcap derivative) of one query block.
 * Every matrix product goes through gemm: 4 x 16 register blocks whose inner
 * loop runs over contiguous columns, so -O3 vectorises it without
 * reassociation (P^T and dS^T are transposed into pt first).
 */

/* ---- element loads and stores ------------------------------------------- */

static void FAT_T(load_row)(const void *base, int64_t off, int n, fat_dtype dt,
                            REAL *dst)
{
    int c;
    switch (dt) {
    case FAT_FLOAT32: {
        const float *src = (const float *)base + off;
        for (c = 0; c < n; ++c) dst[c] = (REAL)src[c];
        break;
    }
    case FAT_FLOAT16: {
        const uint16_t *src = (const uint16_t *)base + off;
        for (c = 0; c < n; ++c) dst[c] = (REAL)half_to_float(src[c]);
        break;
    }
    case FAT_BFLOAT16: {
        const uint16_t *src = (const uint16_t *)base + off;
        for (c = 0; c < n; ++c) dst[c] = (REAL)bf16_to_float(src[c]);
        break;
    }
    case FAT_FLOAT64: {
        const double *src = (const double *)base + off;
        for (c = 0; c < n; ++c) dst[c] = (REAL)src[c];
        break;
    }
    }
}

static void FAT_T(store_row)(void *base, int64_t off, int n, fat_dtype dt,
                             const REAL *src)
{
    int c;
    switch (dt) {
    case FAT_FLOAT32: {
        float *dst = (float *)base + off;
        for (c = 0; c < n; ++c) dst[c] = (float)src[c];
        break;
    }
    case FAT_FLOAT16: {
        uint16_t *dst = (uint16_t *)base + off;
        for (c = 0; c < n; ++c) dst[c] = float_to_half((float)src[c]);
        break;
    }
    case FAT_BFLOAT16: {
        uint16_t *dst = (uint16_t *)base + off;
        for (c = 0; c < n; ++c) dst[c] = float_to_bf16((float)src[c]);
        break;
    }
    case FAT_FLOAT64: {
        double *dst = (double *)base + off;
        for (c = 0; c < n; ++c) dst[c] = (double)src[c];
        break;
    }
    }
}

/* Loads n rows (row stride in elements) into dst (n x width, row-major) and,
 * when dst_t is not NULL, transposed into dst_t (width x FAT_BK). */
static void FAT_T(load_tile)(const void *base, int64_t off, int64_t row_stride,
                             int n, int width, fat_dtype dt, REAL *dst, REAL *dst_t)
{
    for (int j = 0; j < n; ++j) {
        REAL *row = dst + (int64_t)j * width;
        FAT_T(load_row)(base, off + (int64_t)j * row_stride, width, dt, row);
        if (dst_t != NULL)
            for (int c = 0; c < width; ++c)
                dst_t[(int64_t)c * FAT_BK + j] = row[c];
    }
}

/* ---- tile arithmetic ----------------------------------------------------- */

/* out (m x ncols, row stride ldo) = or += a (m x n, lda) * b (n x ncols, ldb).
 * 4 x 16 register blocks, so each loaded b vector feeds four rows. */
static inline void FAT_T(gemm_4x16)(int n, const REAL *restrict a, int64_t lda,
                                    const REAL *restrict b, int64_t ldb,
                                    REAL *restrict out, int64_t ldo, int accumulate)
{
    REAL c0[16] = {0}, c1[16] = {0}, c2[16] = {0}, c3[16] = {0};
    for (int c = 0; c < n; ++c) {
        const REAL *restrict bc = b + (int64_t)c * ldb;
        const REAL x0 = a[c], x1 = a[lda + c], x2 = a[2 * lda + c], x3 = a[3 * lda + c];
        for (int jj = 0; jj < 16; ++jj) {
            c0[jj] += x0 * bc[jj];
            c1[jj] += x1 * bc[jj];
            c2[jj] += x2 * bc[jj];
            c3[jj] += x3 * bc[jj];
        }
    }
    for (int jj = 0; jj < 16; ++jj) {
        out[jj] = (accumulate ? out[jj] : 0) + c0[jj];
        out[ldo + jj] = (accumulate ? out[ldo + jj] : 0) + c1[jj];
        out[2 * ldo + jj] = (accumulate ? out[2 * ldo + jj] : 0) + c2[jj];
        out[3 * ldo + jj] = (accumulate ? out[3 * ldo + jj] : 0) + c3[jj];
    }
}

/* Edge of gemm: rows [i0, m) x columns [j0, ncols) by axpy updates. */
static void FAT_T(gemm_edge)(int i0, int m, int j0, int ncols, int n,
                             const REAL *restrict a, int64_t lda, const REAL *restrict b,
                             int64_t ldb, REAL *restrict out, int64_t ldo, int accumulate)
{
    for (int i = i0; i < m; ++i) {
        REAL *restrict o = out + (int64_t)i * ldo;
        if (!accumulate)
            for (int j = j0; j < ncols; ++j) o[j] = 0;
        for (int c = 0; c < n; ++c) {
            const REAL x = a[(int64_t)i * lda + c];
            const REAL *restrict bc = b + (int64_t)c * ldb;
            for (int j = j0; j < ncols; ++j) o[j] += x * bc[j];
        }
    }
}

static void FAT_T(gemm)(int m, int ncols, int n, const REAL *a, int64_t lda,
                        const REAL *b, int64_t ldb, REAL *out, int64_t ldo, int accumulate)
{
    int i = 0, jfull = ncols / 16 * 16;
    for (; i + 4 <= m; i += 4) {
        for (int j = 0; j < jfull; j += 16)
            FAT_T(gemm_4x16)(n, a + (int64_t)i * lda, lda, b + j, ldb,
                             out + (int64_t)i * ldo + j, ldo, accumulate);
        if (jfull < ncols)
            FAT_T(gemm_edge)(i, i + 4, jfull, ncols, n, a, lda, b, ldb, out, ldo, accumulate);
    }
    if (i < m)
        FAT_T(gemm_edge)(i, m, 0, ncols, n, a, lda, b, ldb, out, ldo, accumulate);
}

/* dst (ncols x FAT_BQ) = src (nrows x FAT_BK) transposed. */
static void FAT_T(transpose_tile)(const REAL *restrict src, int nrows, int ncols,
                                  REAL *restrict dst)
{
    for (int i = 0; i < nrows; ++i)
        for (int j = 0; j < ncols; ++j)
            dst[(int64_t)j * FAT_BQ + i] = src[(int64_t)i * FAT_BK + j];
}

/* out (nrows x FAT_BK) = a (nrows x n) * bt (n x FAT_BK), first ncols columns. */
static void FAT_T(tile_matmul)(const REAL *a, int n, const REAL *bt, int nrows, int ncols,
                               REAL *out)
{
    FAT_T(gemm)(nrows, ncols, n, a, n, bt, FAT_BK, out, FAT_BK, 0);
}


/* Scales raw dot products into scores, applies softcap (keeping 1 - tanh^2
 * in dt when dt is not NULL) and sets masked entries to -inf. */
static void FAT_T(mask_scores)(const fat_params *p, const run_info *r,
                               const seq_info *s, int64_t i0, int nq, int64_t k0,
                               int nk, REAL *sc, REAL *dt)
{
    const REAL scale = (REAL)p->softmax_scale, cap = (REAL)p->softcap;
    const REAL inner = cap > 0 ? scale / cap : 0;
    for (int i = 0; i < nq; ++i) {
        REAL *row = sc + (int64_t)i * FAT_BK;
        REAL *drow = dt != NULL ? dt + (int64_t)i * FAT_BK : NULL;
        int64_t lo = first_key(r, s, i0 + i) - k0, hi = last_key(r, s, i0 + i) - k0;
        if (cap > 0) {
            for (int j = 0; j < nk; ++j) {
                REAL t = REAL_TANH(row[j] * inner);
                row[j] = cap * t;
                if (drow != NULL) drow[j] = 1 - t * t;
            }
        } else {
            for (int j = 0; j < nk; ++j) row[j] *= scale;
        }
        for (int j = 0; j < nk && j < lo; ++j) row[j] = -INFINITY;
        for (int64_t j = hi + 1 < 0 ? 0 : hi + 1; j < nk; ++j) row[j] = -INFINITY;
    }
}

/* ---- forward -------------------------------------------------------------- */

typedef struct {
    REAL *q, *k, *kt, *v, *s, *acc, *m, *l;
} FAT_T(fwd_ws);

static int FAT_T(fwd_ws_alloc)(FAT_T(fwd_ws) *w, const fat_params *p)
{
    size_t nq = (size_t)FAT_BQ * p->d, nkt = (size_t)p->d * FAT_BK;
    size_t nv = (size_t)FAT_BK * p->d_v, ns = (size_t)FAT_BQ * FAT_BK;
    size_t nacc = (size_t)FAT_BQ * p->d_v;
    REAL *buf = (REAL *)malloc((nq + 2 * nkt + nv + ns + nacc + 2 * FAT_BQ) * sizeof(REAL));
    if (buf == NULL)
        return 0;
    w->q = buf;
    w->k = w->q + nq; /* k is FAT_BK x d: same size as kt */
    w->kt = w->k + nkt;
    w->v = w->kt + nkt;
    w->s = w->v + nv;
    w->acc = w->s + ns;
    w->m = w->acc + nacc;
    w->l = w->m + FAT_BQ;
    return 1;
}

/* Online-softmax update of rows' max m, sum l and accumulator acc with one
 * score tile; the tile's scores become probabilities exp(s - m). */
static void FAT_T(online_update)(FAT_T(fwd_ws) *w, int nq, int nk, int dv)
{
    for (int i = 0; i < nq; ++i) {
        REAL *row = w->s + (int64_t)i * FAT_BK;
        REAL *acc = w->acc + (int64_t)i * dv;
        REAL mx = -INFINITY, sum = 0;
        for (int j = 0; j < nk; ++j) mx = row[j] > mx ? row[j] : mx;
        if (mx == -INFINITY) {
            for (int j = 0; j < nk; ++j) row[j] = 0; /* nothing visible here */
            continue;
        }
        if (mx > w->m[i]) {
            REAL alpha = REAL_EXP(w->m[i] - mx); /* 0 when m was -inf */
            w->l[i] *= alpha;
            for (int c = 0; c < dv; ++c) acc[c] *= alpha;
            w->m[i] = mx;
        }
        const REAL mi = w->m[i];
        for (int j = 0; j < nk; ++j) row[j] = REAL_EXP(row[j] - mi);
        for (int j = 0; j < nk; ++j) sum += row[j];
        w->l[i] += sum;
    }
    FAT_T(gemm)(nq, dv, nk, w->s, FAT_BK, w->v, dv, w->acc, dv, 1); /* acc += P V */
}

/* o = acc / l and lse = m + log(l); o = 0, lse = -inf for rows seeing nothing.
 * With lse_exact (backward of float64) only lse is written, in REAL, there. */
static void FAT_T(fwd_store)(const fat_params *p, const run_info *r, const seq_info *s,
                             FAT_T(fwd_ws) *w, int h, int64_t i0, int nq, REAL *lse_exact)
{
    for (int i = 0; i < nq; ++i) {
        if (lse_exact != NULL) {
            lse_exact[(s->rq + i0 + i) * p->hq + h] =
                w->l[i] > 0 ? w->m[i] + REAL_LOG(w->l[i]) : -INFINITY;
            continue;
        }
        REAL *acc = w->acc + (int64_t)i * p->d_v;
        REAL inv = w->l[i] > 0 ? 1 / w->l[i] : 0;
        for (int c = 0; c < p->d_v; ++c) acc[c] *= inv;
        FAT_T(store_row)(p->o, elem_offset(r, s, s->rq, i0 + i, h, p->o_batch_stride,
                                           p->o_row_stride, p->o_head_stride),
                         p->d_v, p->dtype, acc);
        p->lse[lse_offset(p, r, s, i0 + i, h)] =
            w->l[i] > 0 ? (float)(w->m[i] + REAL_LOG(w->l[i])) : -INFINITY;
    }
}

FAT_HOT static void FAT_T(fwd_block)(const fat_params *p, const run_info *r, FAT_T(fwd_ws) *w,
                             int b, int h, int qb, REAL *lse_exact)
{
    seq_info s = make_seq_info(p, r, b);
    int64_t i0 = (int64_t)qb * FAT_BQ, jmin, jmax, k0;
    int nq, kvh = h / r->group;
    if (i0 >= s.sq)
        return;
    nq = s.sq - i0 < FAT_BQ ? (int)(s.sq - i0) : FAT_BQ;
    FAT_T(load_tile)(p->q, elem_offset(r, &s, s.rq, i0, h, p->q_batch_stride,
                                       p->q_row_stride, p->q_head_stride),
                     p->q_row_stride, nq, p->d, p->dtype, w->q, NULL);
    for (int i = 0; i < nq; ++i) {
        w->m[i] = -INFINITY;
        w->l[i] = 0;
    }
    memset(w->acc, 0, (size_t)nq * p->d_v * sizeof(REAL));
    jmin = first_key(r, &s, i0);
    jmax = last_key(r, &s, i0 + nq - 1);
    for (k0 = jmin / FAT_BK * FAT_BK; k0 <= jmax; k0 += FAT_BK) {
        int nk = s.sk - k0 < FAT_BK ? (int)(s.sk - k0) : FAT_BK;
        FAT_T(load_tile)(p->k, elem_offset(r, &s, s.rk, k0, kvh, p->k_batch_stride,
                                           p->k_row_stride, p->k_head_stride),
                         p->k_row_stride, nk, p->d, p->dtype, w->k, w->kt);
        FAT_T(load_tile)(p->v, elem_offset(r, &s, s.rk, k0, kvh, p->v_batch_stride,
                                           p->v_row_stride, p->v_head_stride),
                         p->v_row_stride, nk, p->d_v, p->dtype, w->v, NULL);
        FAT_T(tile_matmul)(w->q, p->d, w->kt, nq, nk, w->s);
        FAT_T(mask_scores)(p, r, &s, i0, nq, k0, nk, w->s, NULL);
        FAT_T(online_update)(w, nq, nk, p->d_v);
    }
    FAT_T(fwd_store)(p, r, &s, w, h, i0, nq, lse_exact);
}

/* The forward pass; with lse_exact != NULL it only computes lse, in REAL. */
static fat_status FAT_T(fwd_all)(const fat_params *p, REAL *lse_exact)
{
    run_info r = make_run_info(p);
    int nqb = (p->sq + FAT_BQ - 1) / FAT_BQ;
    int64_t nwork = (int64_t)p->b * p->hq * nqb;
    int failed = 0;
    if (nwork == 0)
        return FAT_OK;
#ifdef _OPENMP
#pragma omp parallel
#endif
    {
        FAT_T(fwd_ws) w = {0};
        int ok = FAT_T(fwd_ws_alloc)(&w, p);
        if (!ok)
            set_flag(&failed);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t it = 0; it < nwork; ++it) {
            if (!ok)
                continue;
            FAT_T(fwd_block)(p, &r, &w, (int)(it / nqb / p->hq),
                             (int)(it / nqb % p->hq), (int)(it % nqb), lse_exact);
        }
        if (ok)
            free(w.q);
    }
    return failed ? FAT_ERR_OUT_OF_MEMORY : FAT_OK;
}

/* ---- backward ------------------------------------------------------------- */

/* dsum[row * hq + h] = sum_c dout[row, h, c] * o[row, h, c]. */
static void FAT_T(bwd_rowdot)(const fat_params *p, const run_info *r, REAL *dsum)
{
    int64_t nwork = (int64_t)p->b * p->hq;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1)
#endif
    for (int64_t it = 0; it < nwork; ++it) {
        REAL o[FAT_MAX_HEAD_DIM], g[FAT_MAX_HEAD_DIM];
        int h = (int)(it % p->hq);
        seq_info s = make_seq_info(p, r, (int)(it / p->hq));
        for (int64_t i = 0; i < s.sq; ++i) {
            REAL acc = 0;
            FAT_T(load_row)(p->o, elem_offset(r, &s, s.rq, i, h, p->o_batch_stride,
                                              p->o_row_stride, p->o_head_stride),
                            p->d_v, p->dtype, o);
            FAT_T(load_row)(p->dout, elem_offset(r, &s, s.rq, i, h, p->do_batch_stride,
                                                 p->do_row_stride, p->do_head_stride),
                            p->d_v, p->dtype, g);
            for (int c = 0; c < p->d_v; ++c) acc += o[c] * g[c];
            dsum[(s.rq + i) * p->hq + h] = acc;
        }
    }
}

typedef struct {
    REAL *k, *kt, *v, *vt, *dk, *dv; /* one key block */
    REAL *q, *dout, *s, *dp, *dt;    /* one query block */
    REAL *dqt;                       /* split mode: dq of one query block */
    REAL *pt;                        /* P or dS transposed (FAT_BK x FAT_BQ) */
} FAT_T(bwd_ws);

static int FAT_T(bwd_ws_alloc)(FAT_T(bwd_ws) *w, const fat_params *p)
{
    size_t nk = (size_t)FAT_BK * p->d, nv = (size_t)FAT_BK * p->d_v;
    size_t nq = (size_t)FAT_BQ * p->d, ndo = (size_t)FAT_BQ * p->d_v;
    size_t ns = (size_t)FAT_BQ * FAT_BK;
    REAL *buf = (REAL *)malloc((3 * nk + 3 * nv + 2 * nq + ndo + 4 * ns) * sizeof(REAL));
    if (buf == NULL)
        return 0;
    w->k = buf;
    w->kt = w->k + nk; /* kt is d x FAT_BK: same size as k */
    w->v = w->kt + nk;
    w->vt = w->v + nv;
    w->dk = w->vt + nv;
    w->dv = w->dk + nk;
    w->q = w->dv + nv;
    w->dout = w->q + nq;
    w->s = w->dout + ndo;
    w->dp = w->s + ns;
    w->dt = w->dp + ns;
    w->dqt = w->dt + ns;
    w->pt = w->dqt + nq;
    return 1;
}

/* Scores of the tile become P = exp(s - lse); rows with lse = -inf get 0.
 * lse comes from lse_exact when given, else from p->lse. */
static void FAT_T(bwd_probs)(const fat_params *p, const run_info *r, const seq_info *s,
                             int h, int64_t i0, int nq, int nk, REAL *sc,
                             const REAL *lse_exact)
{
    for (int i = 0; i < nq; ++i) {
        REAL *row = sc + (int64_t)i * FAT_BK;
        REAL lse = lse_exact != NULL ? lse_exact[(s->rq + i0 + i) * p->hq + h]
                                     : (REAL)p->lse[lse_offset(p, r, s, i0 + i, h)];
        if (lse == -INFINITY) {
            for (int j = 0; j < nk; ++j) row[j] = 0;
            continue;
        }
        for (int j = 0; j < nk; ++j) row[j] = REAL_EXP(row[j] - lse);
    }
}

/* dS = P * (dP - D) [* (1 - tanh^2)] * scale, in place of dP. */
static void FAT_T(bwd_dscores)(const fat_params *p, const seq_info *s, FAT_T(bwd_ws) *w,
                               const REAL *dsum, int h, int64_t i0, int nq, int nk)
{
    const REAL scale = (REAL)p->softmax_scale;
    for (int i = 0; i < nq; ++i) {
        const REAL *prow = w->s + (int64_t)i * FAT_BK;
        const REAL *trow = w->dt + (int64_t)i * FAT_BK;
        REAL *row = w->dp + (int64_t)i * FAT_BK;
        REAL di = dsum[(s->rq + i0 + i) * p->hq + h];
        if (p->softcap > 0)
            for (int j = 0; j < nk; ++j) row[j] = prow[j] * (row[j] - di) * trow[j] * scale;
        else
            for (int j = 0; j < nk; ++j) row[j] = prow[j] * (row[j] - di) * scale;
    }
}

/* Scratch shared by all backward threads (each writes disjoint rows). */
typedef struct {
    REAL *dq_acc;          /* fused mode: (rows_q x hq x d) dq accumulator */
    const REAL *dsum;      /* (rows_q x hq) D = rowsum(dO * O) */
    const REAL *lse_exact; /* float64 only: lse recomputed in double, or NULL */
} FAT_T(bwd_shared);

/* One (query block, key block) tile of the FlashAttention-2 backward, with
 * K/V of the key block already in w.  Adds dS K into dq (rows dq_stride apart)
 * when dq is not NULL, and P^T dO, dS^T Q into w->dv, w->dk when do_kv. */
FAT_HOT static void FAT_T(bwd_tile)(const fat_params *p, const run_info *r, const seq_info *s,
                            FAT_T(bwd_ws) *w, const FAT_T(bwd_shared) *sh, int h,
                            int64_t i0, int64_t k0, int nk, REAL *dq, int64_t dq_stride,
                            int do_kv)
{
    int nq = s->sq - i0 < FAT_BQ ? (int)(s->sq - i0) : FAT_BQ;
    const int d = p->d, dv = p->d_v;
    FAT_T(load_tile)(p->q, elem_offset(r, s, s->rq, i0, h, p->q_batch_stride,
                                       p->q_row_stride, p->q_head_stride),
                     p->q_row_stride, nq, d, p->dtype, w->q, NULL);
    FAT_T(load_tile)(p->dout, elem_offset(r, s, s->rq, i0, h, p->do_batch_stride,
                                          p->do_row_stride, p->do_head_stride),
                     p->do_row_stride, nq, dv, p->dtype, w->dout, NULL);
    FAT_T(tile_matmul)(w->q, d, w->kt, nq, nk, w->s);
    FAT_T(mask_scores)(p, r, s, i0, nq, k0, nk, w->s, p->softcap > 0 ? w->dt : NULL);
    FAT_T(bwd_probs)(p, r, s, h, i0, nq, nk, w->s, sh->lse_exact);
    if (do_kv) { /* dV += P^T dO */
        FAT_T(transpose_tile)(w->s, nq, nk, w->pt);
        FAT_T(gemm)(nk, dv, nq, w->pt, FAT_BQ, w->dout, dv, w->dv, dv, 1);
    }
    FAT_T(tile_matmul)(w->dout, dv, w->vt, nq, nk, w->dp); /* dP = dO V^T */
    FAT_T(bwd_dscores)(p, s, w, sh->dsum, h, i0, nq, nk);
    if (dq != NULL) /* dQ += dS K */
        FAT_T(gemm)(nq, d, nk, w->dp, FAT_BK, w->k, d, dq, dq_stride, 1);
    if (do_kv) { /* dK += dS^T Q */
        FAT_T(transpose_tile)(w->dp, nq, nk, w->pt);
        FAT_T(gemm)(nk, d, nq, w->pt, FAT_BQ, w->q, d, w->dk, d, 1);
    }
}

static void FAT_T(bwd_load_kv)(const fat_params *p, const run_info *r, const seq_info *s,
                               FAT_T(bwd_ws) *w, int kvh, int64_t k0, int nk)
{
    FAT_T(load_tile)(p->k, elem_offset(r, s, s->rk, k0, kvh, p->k_batch_stride,
                                       p->k_row_stride, p->k_head_stride),
                     p->k_row_stride, nk, p->d, p->dtype, w->k, w->kt);
    FAT_T(load_tile)(p->v, elem_offset(r, s, s->rk, k0, kvh, p->v_batch_stride,
                                       p->v_row_stride, p->v_head_stride),
                     p->v_row_stride, nk, p->d_v, p->dtype, w->v, w->vt);
}

static void FAT_T(bwd_store_kv)(const fat_params *p, const run_info *r, const seq_info *s,
                                FAT_T(bwd_ws) *w, int kvh, int64_t k0, int nk)
{
    for (int j = 0; j < nk; ++j) {
        FAT_T(store_row)(p->dk, elem_offset(r, s, s->rk, k0 + j, kvh, p->dk_batch_stride,
                                            p->dk_row_stride, p->dk_head_stride),
                         p->d, p->dtype, w->dk + (int64_t)j * p->d);
        FAT_T(store_row)(p->dv, elem_offset(r, s, s->rk, k0 + j, kvh, p->dv_batch_stride,
                                            p->dv_row_stride, p->dv_head_stride),
                         p->d_v, p->dtype, w->dv + (int64_t)j * p->d_v);
    }
}

/* dk/dv of one key block of kv head kvh, over every query head of its group;
 * also adds into the dq accumulator when sh->dq_acc is not NULL (fused mode). */
static void FAT_T(bwd_kv_block)(const fat_params *p, const run_info *r, FAT_T(bwd_ws) *w,
                                const FAT_T(bwd_shared) *sh, const seq_info *s, int kvh,
                                int64_t k0)
{
    int nk = s->sk - k0 < FAT_BK ? (int)(s->sk - k0) : FAT_BK;
    int64_t imin = first_row(r, s, k0), imax = last_row(r, s, k0 + nk - 1);
    FAT_T(bwd_load_kv)(p, r, s, w, kvh, k0, nk);
    memset(w->dk, 0, (size_t)nk * p->d * sizeof(REAL));
    memset(w->dv, 0, (size_t)nk * p->d_v * sizeof(REAL));
    for (int g = 0; g < r->group && imin <= imax; ++g) {
        int h = kvh * r->group + g;
        for (int64_t i0 = imin / FAT_BQ * FAT_BQ; i0 <= imax; i0 += FAT_BQ) {
            REAL *dq = sh->dq_acc != NULL
                           ? sh->dq_acc + ((s->rq + i0) * p->hq + h) * p->d : NULL;
            FAT_T(bwd_tile)(p, r, s, w, sh, h, i0, k0, nk, dq, (int64_t)p->hq * p->d, 1);
        }
    }
    FAT_T(bwd_store_kv)(p, r, s, w, kvh, k0, nk);
}

/* Split mode, dq of one query block: loops over its visible key blocks. */
static void FAT_T(bwd_dq_block)(const fat_params *p, const run_info *r, FAT_T(bwd_ws) *w,
                                const FAT_T(bwd_shared) *sh, int b, int h, int64_t i0)
{
    seq_info s = make_seq_info(p, r, b);
    int nq, kvh = h / r->group;
    int64_t jmin, jmax;
    if (i0 >= s.sq)
        return;
    nq = s.sq - i0 < FAT_BQ ? (int)(s.sq - i0) : FAT_BQ;
    memset(w->dqt, 0, (size_t)nq * p->d * sizeof(REAL));
    jmin = first_key(r, &s, i0);
    jmax = last_key(r, &s, i0 + nq - 1);
    for (int64_t k0 = jmin / FAT_BK * FAT_BK; k0 <= jmax; k0 += FAT_BK) {
        int nk = s.sk - k0 < FAT_BK ? (int)(s.sk - k0) : FAT_BK;
        FAT_T(bwd_load_kv)(p, r, &s, w, kvh, k0, nk);
        FAT_T(bwd_tile)(p, r, &s, w, sh, h, i0, k0, nk, w->dqt, p->d, 0);
    }
    for (int i = 0; i < nq; ++i)
        FAT_T(store_row)(p->dq, elem_offset(r, &s, s.rq, i0 + i, h, p->dq_batch_stride,
                                            p->dq_row_stride, p->dq_head_stride),
                         p->d, p->dtype, w->dqt + (int64_t)i * p->d);
}

static void FAT_T(bwd_store_dq)(const fat_params *p, const run_info *r, const REAL *dq_acc)
{
    int64_t nwork = (int64_t)p->b * p->hq;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t it = 0; it < nwork; ++it) {
        int h = (int)(it % p->hq);
        seq_info s = make_seq_info(p, r, (int)(it / p->hq));
        for (int64_t i = 0; i < s.sq; ++i)
            FAT_T(store_row)(p->dq, elem_offset(r, &s, s.rq, i, h, p->dq_batch_stride,
                                                p->dq_row_stride, p->dq_head_stride),
                             p->d, p->dtype, dq_acc + ((s.rq + i) * p->hq + h) * p->d);
    }
}

/* Runs the tile passes over all threads.  fused: item = (batch, kv head),
 * every key block, dq into sh->dq_acc.  split: items = (batch, kv head, key
 * block) for dk/dv, then (batch, query head, query block) for dq; costs ~40%
 * more arithmetic but keeps every thread busy when there are few heads.  Both
 * add in the same order, so the result does not depend on the mode. */
static fat_status FAT_T(bwd_tiles)(const fat_params *p, const run_info *r,
                                   const FAT_T(bwd_shared) *sh)
{
    const int split = sh->dq_acc == NULL;
    const int nkb = (p->sk + FAT_BK - 1) / FAT_BK, nqb = (p->sq + FAT_BQ - 1) / FAT_BQ;
    const int64_t nkv = split ? (int64_t)p->b * p->hkv * nkb : (int64_t)p->b * p->hkv;
    const int64_t nq = split ? (int64_t)p->b * p->hq * nqb : 0;
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel
#endif
    {
        FAT_T(bwd_ws) w = {0};
        int ok = FAT_T(bwd_ws_alloc)(&w, p);
        if (!ok)
            set_flag(&failed);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t it = 0; it < nkv; ++it) {
            int64_t bh = split ? it / nkb : it;
            seq_info s = make_seq_info(p, r, (int)(bh / p->hkv));
            int kvh = (int)(bh % p->hkv);
            if (!ok)
                continue;
            if (split) {
                if ((int64_t)(it % nkb) * FAT_BK < s.sk)
                    FAT_T(bwd_kv_block)(p, r, &w, sh, &s, kvh, (it % nkb) * FAT_BK);
            } else {
                for (int64_t k0 = 0; k0 < s.sk; k0 += FAT_BK)
                    FAT_T(bwd_kv_block)(p, r, &w, sh, &s, kvh, k0);
            }
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t it = 0; it < nq; ++it)
            if (ok)
                FAT_T(bwd_dq_block)(p, r, &w, sh, (int)(it / nqb / p->hq),
                                    (int)(it / nqb % p->hq), (it % nqb) * FAT_BQ);
        if (ok)
            free(w.k);
    }
    return failed ? FAT_ERR_OUT_OF_MEMORY : FAT_OK;
}

static int FAT_T(bwd_use_split)(const fat_params *p)
{
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    return threads > 1 && (int64_t)p->b * p->hkv < 2 * (int64_t)threads;
}

static fat_status FAT_T(bwd_all)(const fat_params *p)
{
    run_info r = make_run_info(p);
    size_t nrows = (size_t)r.rows_q * p->hq;
    REAL *dq_acc = NULL, *dsum = NULL, *lse_exact = NULL;
    int split = FAT_T(bwd_use_split)(p);
    FAT_T(bwd_shared) sh;
    fat_status st = FAT_OK;
    if (nrows > 0) {
        dsum = (REAL *)malloc(nrows * sizeof(REAL));
        dq_acc = split ? NULL : (REAL *)calloc(nrows * p->d, sizeof(REAL));
        lse_exact = FAT_EXACT_LSE ? (REAL *)malloc(nrows * sizeof(REAL)) : NULL;
        if (dsum == NULL || (!split && dq_acc == NULL) ||
            (FAT_EXACT_LSE && lse_exact == NULL)) {
            st = FAT_ERR_OUT_OF_MEMORY;
            goto cleanup;
        }
        FAT_T(bwd_rowdot)(p, &r, dsum);
        /* float64: the fp32 lse would cost ~1e-7 accuracy; recompute it */
        if (FAT_EXACT_LSE && (st = FAT_T(fwd_all)(p, lse_exact)) != FAT_OK)
            goto cleanup;
    } else {
        split = 1; /* no query row: dk = dv = 0, nothing to accumulate */
    }
    sh.dq_acc = dq_acc;
    sh.dsum = dsum;
    sh.lse_exact = lse_exact;
    st = FAT_T(bwd_tiles)(p, &r, &sh);
    if (st == FAT_OK && !split)
        FAT_T(bwd_store_dq)(p, &r, dq_acc);
cleanup:
    free(dq_acc);
    free(dsum);
    free(lse_exact);
    return st;
}
