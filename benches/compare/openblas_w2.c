/* W2's eight products on OpenBLAS (cblas_sgemm, row-major, as Tapir calls them), best of
 * 5x20 calls each, at THREADS threads (default 1): what an OpenBLAS backend could offer
 * beside faer (`benches/examples/gemm_w2` times the same products on faer the same way;
 * compare with its "replace" column, as here the destination is overwritten).
 *
 *   apt-get install libopenblas-dev
 *   gcc -O2 benches/compare/openblas_w2.c -o /tmp/openblas_w2 -lopenblas && /tmp/openblas_w2 [THREADS]
 *
 * Not part of any build or test. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* (name, m, k, n, a used transposed, b used transposed), as in gemm_w2. */
static const struct {
    const char *name;
    int m, k, n, a_t, b_t;
} SHAPES[] = {
    {"h0 = x.W0", 256, 784, 1024, 0, 0},     {"h1 = h0.W1", 256, 1024, 1024, 0, 0},
    {"h2 = h1.W2", 256, 1024, 10, 0, 0},     {"dW2 = h1t.g2", 1024, 256, 10, 1, 0},
    {"dh1 = g2.W2t", 256, 10, 1024, 0, 1},   {"dW1 = h0t.g1", 1024, 256, 1024, 1, 0},
    {"dh0 = g1.W1t", 256, 1024, 1024, 0, 1}, {"dW0 = xt.g0", 784, 256, 1024, 1, 0},
};

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    openblas_set_num_threads(threads);
    printf("%s, %d threads\n", openblas_get_config(), openblas_get_num_threads());
    double total = 0;
    for (int p = 0; p < 8; p++) {
        int m = SHAPES[p].m, k = SHAPES[p].k, n = SHAPES[p].n, a_t = SHAPES[p].a_t, b_t = SHAPES[p].b_t;
        float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n);
        float *c = calloc((size_t)m * n, sizeof(float));
        for (long i = 0; i < (long)m * k; i++) a[i] = ((i * 7919) % 1000) * 1e-3f;
        for (long i = 0; i < (long)k * n; i++) b[i] = ((i * 104729) % 1000) * 1e-3f;
        double best = 1e9;
        for (int r = 0; r < 5; r++) {
            double t = now();
            for (int i = 0; i < 20; i++) {
                cblas_sgemm(CblasRowMajor, a_t ? CblasTrans : CblasNoTrans, b_t ? CblasTrans : CblasNoTrans, m, n, k,
                            1.0f, a, a_t ? m : k, b, b_t ? k : n, 0.0f, c, n);
            }
            double each = (now() - t) / 20;
            if (each < best) best = each;
        }
        printf("%-13s m %5d k %5d n %5d: %.3f ms\n", SHAPES[p].name, m, k, n, best * 1e3);
        total += best * 1e3;
        free(a);
        free(b);
        free(c);
    }
    printf("total %.3f ms\n", total);
    return 0;
}
