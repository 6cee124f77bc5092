/* Memory bandwidth per thread count: each of THREADS threads runs b[i] = a[i]*s + b[i]
 * over its own two 64 MiB arrays, 10 times, and prints the bytes it moved (read a and b,
 * write b) per second; the sum over threads is the machine's bandwidth for that many
 * streams. docs/benchmarks.md uses it to tell bandwidth-bound ops from serial work:
 *
 *   cc -O2 -march=native -pthread benches/compare/triad.c -o /tmp/triad
 *   /tmp/triad 1 && /tmp/triad 2
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BYTES ((size_t)64 << 20)
#define REPS 10

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *run(void *arg) {
    (void)arg;
    float *a = malloc(BYTES), *b = malloc(BYTES);
    if (!a || !b) return NULL;
    memset(a, 1, BYTES);
    memset(b, 1, BYTES);
    double t = now();
    for (int r = 0; r < REPS; r++)
        for (size_t i = 0; i < BYTES / sizeof(float); i++) b[i] = a[i] * 1.0001f + b[i];
    double dt = now() - t;
    printf("%.1f GB/s (b = a*s + b: read a and b, write b)\n", REPS * 3.0 * BYTES / dt / 1e9);
    free(a);
    free(b);
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1;
    if (n < 1 || n > 64) n = 1;
    pthread_t t[64];
    for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, run, NULL);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    return 0;
}
