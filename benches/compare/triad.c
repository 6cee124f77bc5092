/* Memory bandwidth per thread count: each of THREADS threads runs b[i] = a[i]*s + b[i]
 * over its own two arrays of MIB MiB (default 64: past the caches), 10 passes or more for
 * small arrays, all threads starting together at a barrier. Prints each thread's bytes
 * moved (read a and b, write b) per second, then the total over the slowest thread's
 * time: the machine's bandwidth for that many streams. docs/benchmarks.md compares its
 * 2-thread gain with the elementwise ops' E2.
 *
 *   cc -O3 -march=native -pthread benches/compare/triad.c -o /tmp/triad   # -O3 vectorises
 *   /tmp/triad 1 && /tmp/triad 2              # THREADS [MIB]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static size_t BYTES = (size_t)64 << 20;
static int REPS = 10;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static pthread_barrier_t start;
static double slowest;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void *run(void *arg) {
    (void)arg;
    float *a = malloc(BYTES), *b = malloc(BYTES);
    if (!a || !b) return NULL;
    memset(a, 1, BYTES);
    memset(b, 1, BYTES);
    pthread_barrier_wait(&start);
    double t = now();
    for (int r = 0; r < REPS; r++)
        for (size_t i = 0; i < BYTES / sizeof(float); i++) b[i] = a[i] * 1.0001f + b[i];
    double dt = now() - t;
    pthread_mutex_lock(&lock);
    if (dt > slowest) slowest = dt;
    pthread_mutex_unlock(&lock);
    printf("%.1f GB/s (b = a*s + b: read a and b, write b)\n", REPS * 3.0 * BYTES / dt / 1e9);
    free(a);
    free(b);
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1;
    if (n < 1 || n > 64) n = 1;
    int mib = argc > 2 ? atoi(argv[2]) : 64;
    if (mib < 1 || mib > 4096) mib = 64;
    BYTES = (size_t)mib << 20;
    REPS = 640 / mib > 10 ? 640 / mib : 10;
    pthread_t t[64];
    pthread_barrier_init(&start, NULL, n);
    for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, run, NULL);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    printf("%d thread(s): %.1f GB/s in all\n", n, n * REPS * 3.0 * BYTES / slowest / 1e9);
    return 0;
}
