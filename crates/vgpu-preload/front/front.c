/* libvgpu.so, the front object: the exports of the interposer and nothing
 * else until the first CUDA, NVML or driver-dlsym call.
 *
 * With /etc/ld.so.preload this object is loaded into every process of the
 * container (shells, `ls`, data-loader workers), and most of them never
 * touch CUDA. Loading it must cost next to nothing: no symbol relocation at
 * load time, a few pages, and one constructor that only looks whether the
 * driver is already loaded (a program linked against it). Each export is a jump
 * through a slot; the slots start empty, and the first call of any export
 * (or the first dlsym of a `cu`/`nvml` name: the process is about to use
 * the driver) loads the interposer proper (libvgpu_core.so, next to this
 * file) and binds the slots to its hooks. Later calls cost one indirect
 * jump.
 *
 * `dlsym` answers RTLD_NEXT itself with the caller's frame intact (the
 * lookup stays relative to the caller), passes every other lookup to
 * glibc, and asks the core to route only the `cu`- and `nvml`-names that are not our
 * own exports. `dlvsym` is answered the same way (a versioned lookup of
 * "dlsym" would otherwise hand out glibc's own dlsym, past every hook):
 * RTLD_NEXT straight into glibc's dlvsym, "dlsym"/"dlvsym" answered with
 * our exports, driver names routed like dlsym's. glibc's dlvsym itself is
 * found in libc's dynamic symbol table (our export shadows the name for
 * every lookup through the loader, our own included).
 *
 * When the core cannot be loaded (a broken install), every hooked call
 * fails (CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, NVML_ERROR_LIBRARY_NOT_FOUND)
 * with one line on stderr: never a silent pass-through past the limits.
 *
 * Generated list: hooks.h (from the Rust hook table; a test fails when it
 * is stale). x86_64 and aarch64; elsewhere libvgpu_core.so is preloaded
 * directly.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <stddef.h>
#include <unistd.h>

#include "hooks.h"

#define HIDDEN __attribute__((visibility("hidden")))

enum { N = HOOK_COUNT };

/* The slots: zero until bound (no relocation at load). */
HIDDEN void *vgpu_front_slots[N];
/* glibc's dlsym, found once. */
HIDDEN void *vgpu_front_real_dlsym;

#define STR_(x) #x
#define STR(x) STR_(x)

#if defined(__x86_64__)
/* One export per hook: jump through its slot, or take the slow path with
 * the hook's index in r11d (arguments untouched). A hidden alias names the
 * same address for the export table below. */
#define H(i, name, lib)                                                   \
    __asm__(".text\n"                                                     \
            ".globl " #name "\n.type " #name ",@function\n"               \
            ".hidden vgpu_front_h_" #i "\n"                               \
            #name ":\nvgpu_front_h_" #i ":\n"                             \
            "  movq vgpu_front_slots+8*" #i "(%rip), %r11\n"              \
            "  testq %r11, %r11\n"                                        \
            "  jz 1f\n"                                                   \
            "  jmpq *%r11\n"                                              \
            "1:\n"                                                        \
            "  movl $" #i ", %r11d\n"                                     \
            "  jmp vgpu_front_slow\n"                                     \
            ".size " #name ", .-" #name "\n");                            \
    extern void vgpu_front_h_##i(void) HIDDEN;
HOOKS(H)
#undef H

/* The slow path: save the argument registers, resolve (loading the core
 * the first time), restore, jump to whatever the slot now holds. */
__asm__(".text\n"
        ".hidden vgpu_front_slow\n.type vgpu_front_slow,@function\n"
        "vgpu_front_slow:\n"
        "  pushq %rdi\n  pushq %rsi\n  pushq %rdx\n"
        "  pushq %rcx\n  pushq %r8\n  pushq %r9\n"
        /* entry rsp = 8 mod 16; 6 pushes + 136 = 0 mod 16 for the call */
        "  subq $136, %rsp\n"
        "  movdqu %xmm0, 0(%rsp)\n  movdqu %xmm1, 16(%rsp)\n"
        "  movdqu %xmm2, 32(%rsp)\n  movdqu %xmm3, 48(%rsp)\n"
        "  movdqu %xmm4, 64(%rsp)\n  movdqu %xmm5, 80(%rsp)\n"
        "  movdqu %xmm6, 96(%rsp)\n  movdqu %xmm7, 112(%rsp)\n"
        "  movl %r11d, %edi\n"
        "  call vgpu_front_resolve\n"
        "  movdqu 0(%rsp), %xmm0\n  movdqu 16(%rsp), %xmm1\n"
        "  movdqu 32(%rsp), %xmm2\n  movdqu 48(%rsp), %xmm3\n"
        "  movdqu 64(%rsp), %xmm4\n  movdqu 80(%rsp), %xmm5\n"
        "  movdqu 96(%rsp), %xmm6\n  movdqu 112(%rsp), %xmm7\n"
        "  addq $136, %rsp\n"
        "  popq %r9\n  popq %r8\n  popq %rcx\n"
        "  popq %rdx\n  popq %rsi\n  popq %rdi\n"
        "  jmpq *%rax\n"
        ".size vgpu_front_slow, .-vgpu_front_slow\n");

/* dlsym: RTLD_NEXT straight into glibc with the caller's frame (glibc
 * reads its return address); everything else through vgpu_front_dlsym. */
__asm__(".text\n"
        ".globl dlsym\n.type dlsym,@function\n"
        ".hidden vgpu_front_dlsym_self\n"
        "dlsym:\nvgpu_front_dlsym_self:\n"
        "  cmpq $-1, %rdi\n"
        "  jne 2f\n"
        "  movq vgpu_front_real_dlsym(%rip), %rax\n"
        "  testq %rax, %rax\n"
        "  jz 3f\n"
        "  jmpq *%rax\n"
        "3:\n"
        "  pushq %rdi\n  pushq %rsi\n  subq $8, %rsp\n"
        "  call vgpu_front_find_dlsym\n"
        "  addq $8, %rsp\n  popq %rsi\n  popq %rdi\n"
        "  testq %rax, %rax\n"
        "  jz 4f\n"
        "  jmpq *%rax\n"
        "4:\n"
        "  ret\n"
        "2:\n"
        "  jmp vgpu_front_dlsym\n"
        ".size dlsym, .-dlsym\n");

/* dlvsym: the same shape; RTLD_NEXT keeps the caller's frame. */
__asm__(".text\n"
        ".globl dlvsym\n.type dlvsym,@function\n"
        ".hidden vgpu_front_dlvsym_self\n"
        "dlvsym:\nvgpu_front_dlvsym_self:\n"
        "  cmpq $-1, %rdi\n"
        "  jne 2f\n"
        "  movq vgpu_front_real_dlvsym(%rip), %rax\n"
        "  testq %rax, %rax\n"
        "  jz 3f\n"
        "  jmpq *%rax\n"
        "3:\n"
        "  pushq %rdi\n  pushq %rsi\n  pushq %rdx\n"
        "  call vgpu_front_find_dlvsym\n"
        "  popq %rdx\n  popq %rsi\n  popq %rdi\n"
        "  testq %rax, %rax\n"
        "  jz 4f\n"
        "  jmpq *%rax\n"
        "4:\n"
        "  ret\n"
        "2:\n"
        "  jmp vgpu_front_dlvsym\n"
        ".size dlvsym, .-dlvsym\n");
#elif defined(__aarch64__)
/* aarch64: the same four pieces. x16/x17 (IP0/IP1) are the registers the
 * procedure-call standard leaves to veneers like these; x8 (indirect
 * result), x0-x7 and q0-q7 carry arguments and are preserved up to the
 * jump. x30 is never changed on a path that jumps on, so the callee (and
 * glibc's RTLD_NEXT lookup, which reads the caller's address) sees the
 * original caller. */
#define H(i, name, lib)                                                   \
    __asm__(".text\n"                                                     \
            ".globl " #name "\n.type " #name ",%function\n"               \
            ".hidden vgpu_front_h_" #i "\n"                               \
            ".p2align 2\n"                                                \
            #name ":\nvgpu_front_h_" #i ":\n"                             \
            "  adrp x16, vgpu_front_slots+8*" #i "\n"                     \
            "  ldr x16, [x16, #:lo12:vgpu_front_slots+8*" #i "]\n"        \
            "  cbz x16, 1f\n"                                             \
            "  br x16\n"                                                  \
            "1:\n"                                                        \
            "  mov w16, #" #i "\n"                                        \
            "  b vgpu_front_slow\n"                                       \
            ".size " #name ", .-" #name "\n");                            \
    extern void vgpu_front_h_##i(void) HIDDEN;
HOOKS(H)
#undef H

/* The slow path: a frame holding x29/x30, x0-x8 and q0-q7 (224 bytes,
 * 16-aligned), resolve, restore, jump to whatever the slot now holds. */
__asm__(".text\n"
        ".hidden vgpu_front_slow\n.type vgpu_front_slow,%function\n"
        ".p2align 2\n"
        "vgpu_front_slow:\n"
        "  stp x29, x30, [sp, #-224]!\n"
        "  mov x29, sp\n"
        "  stp x0, x1, [sp, #16]\n  stp x2, x3, [sp, #32]\n"
        "  stp x4, x5, [sp, #48]\n  stp x6, x7, [sp, #64]\n"
        "  str x8, [sp, #80]\n"
        "  stp q0, q1, [sp, #96]\n  stp q2, q3, [sp, #128]\n"
        "  stp q4, q5, [sp, #160]\n  stp q6, q7, [sp, #192]\n"
        "  mov w0, w16\n"
        "  bl vgpu_front_resolve\n"
        "  mov x16, x0\n"
        "  ldp q6, q7, [sp, #192]\n  ldp q4, q5, [sp, #160]\n"
        "  ldp q2, q3, [sp, #128]\n  ldp q0, q1, [sp, #96]\n"
        "  ldr x8, [sp, #80]\n"
        "  ldp x6, x7, [sp, #64]\n  ldp x4, x5, [sp, #48]\n"
        "  ldp x2, x3, [sp, #32]\n  ldp x0, x1, [sp, #16]\n"
        "  ldp x29, x30, [sp], #224\n"
        "  br x16\n"
        ".size vgpu_front_slow, .-vgpu_front_slow\n");

/* dlsym: RTLD_NEXT ((void *)-1) straight into glibc with x30 intact;
 * everything else through vgpu_front_dlsym. */
__asm__(".text\n"
        ".globl dlsym\n.type dlsym,%function\n"
        ".hidden vgpu_front_dlsym_self\n"
        ".p2align 2\n"
        "dlsym:\nvgpu_front_dlsym_self:\n"
        "  cmn x0, #1\n"
        "  b.ne 2f\n"
        "  adrp x16, vgpu_front_real_dlsym\n"
        "  ldr x16, [x16, #:lo12:vgpu_front_real_dlsym]\n"
        "  cbz x16, 3f\n"
        "  br x16\n"
        "3:\n"
        "  stp x29, x30, [sp, #-32]!\n"
        "  mov x29, sp\n"
        "  stp x0, x1, [sp, #16]\n"
        "  bl vgpu_front_find_dlsym\n"
        "  mov x16, x0\n"
        "  ldp x0, x1, [sp, #16]\n"
        "  ldp x29, x30, [sp], #32\n"
        "  cbz x16, 4f\n"
        "  br x16\n"
        "4:\n"
        "  mov x0, #0\n"
        "  ret\n"
        "2:\n"
        "  b vgpu_front_dlsym\n"
        ".size dlsym, .-dlsym\n");

/* dlvsym: the same shape with three arguments. */
__asm__(".text\n"
        ".globl dlvsym\n.type dlvsym,%function\n"
        ".hidden vgpu_front_dlvsym_self\n"
        ".p2align 2\n"
        "dlvsym:\nvgpu_front_dlvsym_self:\n"
        "  cmn x0, #1\n"
        "  b.ne 2f\n"
        "  adrp x16, vgpu_front_real_dlvsym\n"
        "  ldr x16, [x16, #:lo12:vgpu_front_real_dlvsym]\n"
        "  cbz x16, 3f\n"
        "  br x16\n"
        "3:\n"
        "  stp x29, x30, [sp, #-48]!\n"
        "  mov x29, sp\n"
        "  stp x0, x1, [sp, #16]\n"
        "  str x2, [sp, #32]\n"
        "  bl vgpu_front_find_dlvsym\n"
        "  mov x16, x0\n"
        "  ldr x2, [sp, #32]\n"
        "  ldp x0, x1, [sp, #16]\n"
        "  ldp x29, x30, [sp], #48\n"
        "  cbz x16, 4f\n"
        "  br x16\n"
        "4:\n"
        "  mov x0, #0\n"
        "  ret\n"
        "2:\n"
        "  b vgpu_front_dlvsym\n"
        ".size dlvsym, .-dlvsym\n");
#else
#error "the front has x86_64 and aarch64 paths only (build.rs builds it for those)"
#endif

/* Hidden names of the two exports: their addresses need no relocation. */
extern void *dlsym_export(void *, const char *) __asm__("vgpu_front_dlsym_self") HIDDEN;
extern void *dlvsym_export(void *, const char *, const char *) __asm__("vgpu_front_dlvsym_self") HIDDEN;

typedef void *(*dlsym_fn)(void *, const char *);
typedef const void *const *(*bind_fn)(unsigned, const char *const *, void *const *, size_t, void *);
typedef void *(*route_fn)(const char *, void *);

static const char names[] = HOOKS(HOOK_NAME);
static const char libs[] = HOOKS(HOOK_LIB);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void *core;
static route_fn core_route;

/* build.rs defines these from the Rust side's constants (one source):
 * BIND_ABI from src/ffi/front_abi.rs, the codes from vgpu-cuda-abi. */
#if !defined(VGPU_BIND_ABI) || !defined(VGPU_FAIL_CUDA) || !defined(VGPU_FAIL_NVML)
#error "build.rs passes VGPU_BIND_ABI, VGPU_FAIL_CUDA and VGPU_FAIL_NVML"
#endif
/* CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, NVML_ERROR_LIBRARY_NOT_FOUND. */
static int fail_cuda(void) { return VGPU_FAIL_CUDA; }
static int fail_nvml(void) { return VGPU_FAIL_NVML; }

/* glibc's dlvsym, found once. */
HIDDEN void *vgpu_front_real_dlvsym;

static int same(const char *a, const char *b) {
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}

/* A dynamic-section address: relocated by the loader on x86_64, not on
 * every architecture. */
static const void *dyn_ptr(const struct link_map *m, ElfW(Addr) p) {
    return (const void *)(p < m->l_addr ? p + m->l_addr : p);
}

/* The default-version definition of `want` in the object of `m`, by its
 * GNU hash table (NULL when there is none). */
static void *lookup_in(const struct link_map *m, const char *want) {
    const ElfW(Sym) *syms = NULL;
    const char *strs = NULL;
    const uint32_t *gh = NULL;
    const ElfW(Half) *versym = NULL;
    for (const ElfW(Dyn) *d = m->l_ld; d && d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_SYMTAB)
            syms = dyn_ptr(m, d->d_un.d_ptr);
        else if (d->d_tag == DT_STRTAB)
            strs = dyn_ptr(m, d->d_un.d_ptr);
        else if (d->d_tag == DT_GNU_HASH)
            gh = dyn_ptr(m, d->d_un.d_ptr);
        else if (d->d_tag == DT_VERSYM)
            versym = dyn_ptr(m, d->d_un.d_ptr);
    }
    if (!syms || !strs || !gh)
        return NULL;
    uint32_t h = 5381;
    for (const char *c = want; *c; c++)
        h = h * 33 + (unsigned char)*c;
    uint32_t nbuckets = gh[0], symoffset = gh[1], bloom_words = gh[2];
    if (nbuckets == 0)
        return NULL;
    const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)&gh[4] + bloom_words);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t i = buckets[h % nbuckets];
    if (i < symoffset)
        return NULL;
    for (;; i++) {
        uint32_t ch = chain[i - symoffset];
        if ((ch | 1) == (h | 1) && same(strs + syms[i].st_name, want) &&
            syms[i].st_shndx != SHN_UNDEF && !(versym && (versym[i] & 0x8000)))
            return (void *)(m->l_addr + syms[i].st_value);
        if (ch & 1)
            return NULL;
    }
}

HIDDEN void *vgpu_front_find_dlvsym(void) {
    void *p = __atomic_load_n(&vgpu_front_real_dlvsym, __ATOMIC_ACQUIRE);
    if (p)
        return p;
    /* glibc's soname (no address taken: nothing to relocate at load). */
    struct link_map *m = NULL;
    void *h = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    if (h && dlinfo(h, RTLD_DI_LINKMAP, &m) != 0)
        m = NULL;
    p = m ? lookup_in(m, "dlvsym") : NULL;
    __atomic_store_n(&vgpu_front_real_dlvsym, p, __ATOMIC_RELEASE);
    return p;
}

typedef void *(*dlvsym_fn)(void *, const char *, const char *);

HIDDEN void *vgpu_front_find_dlsym(void) {
    void *p = __atomic_load_n(&vgpu_front_real_dlsym, __ATOMIC_ACQUIRE);
    if (p)
        return p;
    dlvsym_fn v = (dlvsym_fn)vgpu_front_find_dlvsym();
    if (!v)
        return NULL;
    /* Called from here, RTLD_NEXT is relative to this object: glibc's. */
    p = v(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    /* Older glibc: the architecture's baseline version. */
    if (!p)
        p = v(RTLD_NEXT, "dlsym", "GLIBC_2.2.5"); /* x86_64 */
    if (!p)
        p = v(RTLD_NEXT, "dlsym", "GLIBC_2.17"); /* aarch64 */
    __atomic_store_n(&vgpu_front_real_dlsym, p, __ATOMIC_RELEASE);
    return p;
}

static size_t len(const char *s) {
    size_t n = 0;
    while (s[n])
        n++;
    return n;
}

/* One line on stderr: "[vgpu] <pid> error: <a><b><c>". */
static void say(const char *a, const char *b, const char *c) {
    char buf[1024];
    size_t n = 0;
    const char *head = "[vgpu] ";
    for (size_t i = 0; head[i] && n < sizeof buf; i++)
        buf[n++] = head[i];
    char digits[16];
    int d = 0;
    for (unsigned pid = (unsigned)getpid(); d == 0 || pid; pid /= 10)
        digits[d++] = (char)('0' + pid % 10);
    while (d && n < sizeof buf)
        buf[n++] = digits[--d];
    const char *parts[] = {" error: ", a, b, c};
    for (int k = 0; k < 4; k++)
        for (size_t i = 0; parts[k] && parts[k][i] && n < sizeof buf - 1; i++)
            buf[n++] = parts[k][i];
    buf[n++] = '\n';
    for (size_t off = 0; off < n;) {
        ssize_t w = write(2, buf + off, n - off);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
}

static void *fail_of(unsigned i) {
    return libs[i] == 'n' ? (void *)fail_nvml : (void *)fail_cuda;
}

/* This object's own bounds, from linker-defined hidden symbols (no
 * relocation: PC-relative). dladdr answered the same questions by
 * searching symbol tables, some 10,000 instructions a call, twice per
 * routed dlsym. */
extern const ElfW(Ehdr) __ehdr_start HIDDEN;
extern const char _end[] HIDDEN;

static int is_own(const void *p) {
    return (const char *)p >= (const char *)&__ehdr_start && (const char *)p < _end;
}

static int own_name_cb(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    /* Linked at 0: the load bias is the ELF header's address. */
    if (info->dlpi_addr != (ElfW(Addr))&__ehdr_start)
        return 0;
    *(const char **)data = info->dlpi_name;
    return 1;
}

/* The path the loader opened this object by (the link map's name). */
static const char *own_path(void) {
    const char *name = NULL;
    dl_iterate_phdr(own_name_cb, &name);
    return name && name[0] ? name : NULL;
}

/* `dir_of(file)/libvgpu_core.so` into `path`; 0 when it does not fit. */
static int core_beside(const char *file, char *path, size_t size) {
    size_t n = len(file), cut = 0;
    for (size_t i = 0; i < n; i++)
        if (file[i] == '/')
            cut = i + 1;
    const char *core_name = "libvgpu_core.so";
    size_t m = len(core_name);
    if (cut + m >= size)
        return 0;
    for (size_t i = 0; i < cut; i++)
        path[i] = file[i];
    for (size_t i = 0; i <= m; i++)
        path[cut + i] = core_name[i];
    return 1;
}

/* NULL when `path` is a whole ELF object (every segment's bytes are in
 * the file), else why not. dlopen maps a truncated object and the first
 * touch of a page past its end is SIGBUS, in whatever process called
 * CUDA or NVML first: refuse it here instead. */
static const char *whole_elf(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return "cannot open libvgpu_core.so";
    struct stat st;
    ElfW(Ehdr) eh;
    /* The ELF header and (nearly always) the program headers in one read:
     * one system call where a read per header took thirteen. */
    unsigned char head[4096];
    ssize_t got = -1;
    const char *why = NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        why = "libvgpu_core.so is not a regular file";
    else if ((got = pread(fd, head, sizeof head, 0)) < (ssize_t)sizeof eh)
        why = "libvgpu_core.so is not an ELF object (truncated or corrupt)";
    if (!why) {
        __builtin_memcpy(&eh, head, sizeof eh);
        if (eh.e_ident[0] != 0x7f || eh.e_ident[1] != 'E' || eh.e_ident[2] != 'L' ||
            eh.e_ident[3] != 'F' || eh.e_phentsize != sizeof(ElfW(Phdr)))
            why = "libvgpu_core.so is not an ELF object (truncated or corrupt)";
    }
    for (unsigned i = 0; !why && i < eh.e_phnum; i++) {
        ElfW(Phdr) ph;
        ElfW(Off) at = eh.e_phoff + (ElfW(Off))i * sizeof ph;
        if (at + sizeof ph <= (ElfW(Off))got)
            __builtin_memcpy(&ph, head + at, sizeof ph);
        else if (pread(fd, &ph, sizeof ph, (off_t)at) != (ssize_t)sizeof ph)
            why = "libvgpu_core.so is truncated (program headers)";
        if (!why && ph.p_type == PT_LOAD && ph.p_offset + ph.p_filesz > (ElfW(Off))st.st_size)
            why = "libvgpu_core.so is truncated (a segment ends past the end of the file)";
    }
    if (!why && (ElfW(Off))st.st_size < eh.e_shoff)
        why = "libvgpu_core.so is truncated";
    close(fd);
    return why;
}

static void load_core(void) {
    dlsym_fn real = (dlsym_fn)vgpu_front_find_dlsym();
    char path[4096];
    const char *why = "cannot find libvgpu.so's own path";
    const char *self = real ? own_path() : NULL;
    if (self) {
        /* Beside the path we were loaded by, else beside the file itself
         * (`vgpu run` preloads a symlink when the real path has a space). */
        int found = core_beside(self, path, sizeof path) && access(path, F_OK) == 0;
        char *real_path = found ? NULL : realpath(self, NULL);
        if (real_path) {
            char again[4096];
            if (core_beside(real_path, again, sizeof again) && access(again, F_OK) == 0) {
                for (size_t i = 0; i <= len(again); i++)
                    path[i] = again[i];
                found = 1;
            }
            free(real_path);
        }
        if (found || core_beside(self, path, sizeof path)) {
            why = whole_elf(path);
            if (!why) {
                core = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
                why = core ? NULL : dlerror();
            }
        }
    }
    const void *const *impl = NULL;
    if (core) {
        bind_fn bind = (bind_fn)real(core, "vgpu_core_bind");
        core_route = (route_fn)real(core, "vgpu_core_route_dlsym");
        const char *name_of[N];
        void *export_of[N] = {
#define H(i, name, lib) (void *)vgpu_front_h_##i,
            HOOKS(H)
#undef H
        };
        const char *p = names;
        for (unsigned i = 0; i < N; i++) {
            name_of[i] = p;
            p += len(p) + 1;
        }
        impl = bind && core_route ? bind(VGPU_BIND_ABI, name_of, export_of, N, (void *)real) : NULL;
        if (!impl)
            why = "libvgpu_core.so does not bind (a different build?)";
    }
    if (!impl) {
        core_route = NULL;
        say("cannot load the interposer (", why ? why : "unknown error",
            "); every CUDA and NVML call through libvgpu.so fails");
    }
    for (unsigned i = 0; i < N; i++) {
        void *t = impl && impl[i] ? (void *)impl[i] : fail_of(i);
        __atomic_store_n(&vgpu_front_slots[i], t, __ATOMIC_RELEASE);
    }
}

HIDDEN void *vgpu_front_resolve(unsigned i) {
    pthread_once(&once, load_core);
    void *t = __atomic_load_n(&vgpu_front_slots[i], __ATOMIC_ACQUIRE);
    return t ? t : fail_of(i);
}

/* Whether this loaded object is the driver (libcuda.so.1). */
static int driver_cb(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    (void)data;
    const char *base = info->dlpi_name;
    for (const char *p = base; *p; p++)
        if (*p == '/')
            base = p + 1;
    return same(base, "libcuda.so.1") || same(base, "libcuda.so");
}

/* The one constructor. A program linked against the driver (libcuda.so.1
 * is already loaded when constructors run) is about to use it: load the
 * core now, before main, rather than inside its first call, where start-up
 * latency counts. Every other process (shells, tools, a Python that will
 * dlopen the driver later: its first dlsym of a driver name loads the core)
 * pays one walk of the loaded objects. */
__attribute__((constructor)) static void early(void) {
    if (dl_iterate_phdr(driver_cb, NULL))
        pthread_once(&once, load_core);
}

static void *route(const char *name, void *found);

/* dlsym for every handle but RTLD_NEXT. */
HIDDEN void *vgpu_front_dlsym(void *handle, const char *name) {
    dlsym_fn real = (dlsym_fn)vgpu_front_find_dlsym();
    if (!real)
        return NULL;
    void *found = real(handle, name);
    if (!found || !name)
        return found;
    return route(name, found);
}

/* dlvsym for every handle but RTLD_NEXT: a versioned lookup of the lookup
 * functions gets ours, of a driver name the same route as dlsym. */
HIDDEN void *vgpu_front_dlvsym(void *handle, const char *name, const char *version) {
    dlvsym_fn real = (dlvsym_fn)vgpu_front_find_dlvsym();
    if (!real)
        return NULL;
    void *found = real(handle, name, version);
    if (!found || !name)
        return found;
    return route(name, found);
}

/* What a lookup of `name` that found `found` hands out. */
static void *route(const char *name, void *found) {
    /* The lookup functions themselves, from any handle (libc's own
     * included): ours, so that no lookup reaches past the hooks. */
    if (name[0] == 'd' && (same(name, "dlsym") || same(name, "dlvsym")))
        return same(name, "dlsym") ? (void *)dlsym_export : (void *)dlvsym_export;
    int cuda = name[0] == 'c' && name[1] == 'u';
    int nvml = name[0] == 'n' && name[1] == 'v' && name[2] == 'm' && name[3] == 'l';
    if (!cuda && !nvml)
        return found;
    /* A driver name is being looked up: the process is about to use CUDA
     * or NVML, so load the core now rather than inside its first call
     * (cuInit), where start-up latency counts. Our own export (a lookup in
     * the global scope) then needs no routing. */
    pthread_once(&once, load_core);
    if (is_own(found))
        return found;
    if (core_route)
        return core_route(name, found);
    /* No core: a hooked name gets our (failing) export, never the driver. */
    const char *p = names;
    for (unsigned i = 0; i < N; i++) {
        const char *q = name;
        const char *r = p;
        while (*q && *q == *r)
            q++, r++;
        if (!*q && !*r) {
            void *exports[N] = {
#define H(i, name, lib) (void *)vgpu_front_h_##i,
                HOOKS(H)
#undef H
            };
            return exports[i];
        }
        p += len(p) + 1;
    }
    return found;
}

/* The coverage table, from the core (`vgpu hooks`). */
__attribute__((visibility("default"))) const char *vgpu_hook_table(void) {
    pthread_once(&once, load_core);
    dlsym_fn real = (dlsym_fn)vgpu_front_find_dlsym();
    if (!core || !real)
        return NULL;
    const char *(*t)(void) = (const char *(*)(void))real(core, "vgpu_hook_table");
    return t ? t() : NULL;
}
