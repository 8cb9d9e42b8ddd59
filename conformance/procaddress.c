/* procaddress: cuGetProcAddress_v2 for every request libcudart 12.9 makes.
 *
 * usage: procaddress REQUESTS_FILE EXPECTED_MAP
 *   REQUESTS_FILE: `name|cudaVersion|flags` lines (read at run time)
 *   EXPECTED_MAP:  `name|cudaVersion|flags|export` lines generated from
 *                  cudaTypedefs.h by conformance/gen-procaddress-map
 *
 * For each request whose expected export the driver library (libcuda.so.1)
 * provides, cuGetProcAddress_v2 must return CUDA_SUCCESS,
 * CU_GET_PROC_ADDRESS_SUCCESS and exactly the entry a direct call by that
 * name reaches (dlsym(RTLD_DEFAULT, export): the driver's own, or an
 * interposer's hook when one is preloaded); for the rest it must return
 * CUDA_ERROR_NOT_FOUND with CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND and
 * *pfn == NULL, whatever an interposer exports.
 */
#define _GNU_SOURCE
#define CHECK_CUDA 1
#include "check.h"

#include <dlfcn.h>

WEAK(cuInit);
WEAK(cuGetProcAddress_v2);

struct req {
    char name[128];
    int version;
    unsigned long long flags;
    char export_[128];
};

static int parse(const char *line, struct req *r, int with_export) {
    char buf[512];
    if (!line || strlen(line) >= sizeof buf)
        return 0;
    snprintf(buf, sizeof buf, "%s", line);
    buf[strcspn(buf, "\r\n")] = 0;
    char *f[4] = {0};
    char *p = buf;
    int n = 0;
    for (; n < 4; n++) {
        f[n] = p;
        p = strchr(p, '|');
        if (!p)
            break;
        *p++ = 0;
    }
    if (n != (with_export ? 3 : 2) || (p && with_export))
        return 0;
    char *end;
    snprintf(r->name, sizeof r->name, "%s", f[0]);
    r->version = (int)strtol(f[1], &end, 10);
    if (!*f[1] || *end)
        return 0;
    r->flags = strtoull(f[2], &end, 10);
    if (!*f[2] || *end)
        return 0;
    if (with_export)
        snprintf(r->export_, sizeof r->export_, "%s", f[3]);
    return 1;
}

int main(int argc, char **argv) {
    g_prog = "procaddress";
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 3) {
        fprintf(stderr, "usage: %s REQUESTS_FILE EXPECTED_MAP\n", argv[0]);
        return 2;
    }
    FILE *rq = fopen(argv[1], "r"), *mp = fopen(argv[2], "r");
    if (!rq || !mp) {
        perror(!rq ? argv[1] : argv[2]);
        return 2;
    }
    if (!OK_CU(cuInit, 0))
        return finish();
    void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!CHECK(driver != NULL, "libcuda.so.1 is loaded"))
        return finish();
    char *line = NULL, *mline = NULL;
    size_t cap = 0, mcap = 0;
    int lineno = 0, found = 0, absent = 0;
    while (getline(&line, &cap, rq) >= 0) {
        lineno++;
        if (line[0] == '#' || line[0] == '\n')
            continue;
        struct req r, m;
        if (!parse(line, &r, 0)) {
            fprintf(stderr, "%s:%d: expected name|cudaVersion|flags, got %s", argv[1], lineno, line);
            return 2;
        }
        /* The next data line of the map must describe the same request. */
        int more;
        while ((more = getline(&mline, &mcap, mp) >= 0) && mline[0] == '#') {
        }
        if (!more && mline)
            mline[0] = 0;
        if (!parse(mline, &m, 1) || strcmp(m.name, r.name) || m.version != r.version ||
            m.flags != r.flags) {
            fail_(__LINE__, "%s:%d %s|%d|%llu: expected map is stale (has \"%.*s\"); rerun "
                            "conformance/gen-procaddress-map",
                  argv[1], lineno, r.name, r.version, r.flags,
                  mline ? (int)strcspn(mline, "\n") : 0, mline ? mline : "");
            return finish();
        }
        void *want = strcmp(m.export_, "-") && dlsym(driver, m.export_)
                         ? dlsym(RTLD_DEFAULT, m.export_)
                         : NULL;
        void *pfn = (void *)0x1; /* must be overwritten either way */
        CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)-1;
        CUresult res = CU(cuGetProcAddress_v2, r.name, &pfn, r.version, r.flags, &st);
        char what[400];
        snprintf(what, sizeof what, "%s|%d|%llu -> %s", r.name, r.version, r.flags,
                 want ? m.export_ : "not found");
        if (want) {
            found++;
            if (res == CUDA_SUCCESS && st == CU_GET_PROC_ADDRESS_SUCCESS && pfn == want)
                pass_("%s", what);
            else {
                Dl_info di;
                const char *got = pfn && pfn != (void *)1 && dladdr(pfn, &di) && di.dli_sname
                                      ? di.dli_sname
                                      : "?";
                fail_(__LINE__, "%s: returned %s, symbolStatus %d, pfn %p (%s), want %p", what,
                      cu_name(res), (int)st, pfn, got, want);
            }
        } else {
            absent++;
            if (res == CUDA_ERROR_NOT_FOUND && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND &&
                pfn == NULL)
                pass_("%s", what);
            else
                fail_(__LINE__, "%s: returned %s, symbolStatus %d, pfn %p; want CUDA_ERROR_NOT_FOUND, "
                                "SYMBOL_NOT_FOUND, NULL",
                      what, cu_name(res), (int)st, pfn);
        }
    }
    printf("# %d requests the library implements, %d it does not\n", found, absent);
    return finish();
}
