/* The address of a libc function no screen refuses, found without importing dlsym: from the address of one
 * function inside libc down to libc's ELF header, then through its dynamic symbol table. Pasted into the hostile
 * kernels that need it (tests/test_judge_integrity.py hostile_source), as raw.h is. */
#include <elf.h>
#include <stdint.h>
#include <string.h>

static int same(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

static void *libc_symbol(const void *inside_libc, const char *want) {
    uintptr_t base = (uintptr_t)inside_libc & ~(uintptr_t)4095;
    while (memcmp((const void *)base, ELFMAG, SELFMAG) != 0) base -= 4096;
    const Elf64_Ehdr *header = (const Elf64_Ehdr *)base;
    const Elf64_Phdr *segments = (const Elf64_Phdr *)(base + header->e_phoff);
    const Elf64_Dyn *dynamic = 0;
    for (int i = 0; i < header->e_phnum; i++)
        if (segments[i].p_type == PT_DYNAMIC) dynamic = (const Elf64_Dyn *)(base + segments[i].p_vaddr);
    if (!dynamic) return 0;
    uintptr_t symbols = 0, names = 0;
    for (; dynamic->d_tag != DT_NULL; dynamic++) {
        if (dynamic->d_tag == DT_SYMTAB) symbols = dynamic->d_un.d_ptr;
        if (dynamic->d_tag == DT_STRTAB) names = dynamic->d_un.d_ptr;
    }
    if (symbols < base) symbols += base;
    if (names < base) names += base;
    for (const Elf64_Sym *s = (const Elf64_Sym *)symbols; (uintptr_t)s < names; s++)
        if (s->st_value && same((const char *)names + s->st_name, want)) return (void *)(base + s->st_value);
    return 0;
}
