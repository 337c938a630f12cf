/*
 * t_bool.c - checks vgpu_bool_parse (include/vgpu_bool.h) against the shared truth table file.
 * Usage: t_bool <table file>. Prints one line per mismatch and "rows <n> mismatches <m>".
 * Exit 0 only when every row matches and the file had rows (an empty table proves nothing).
 */
#include <stdio.h>
#include <string.h>
#include "vgpu_bool.h"

/* Unquotes the first "..." of `line` into out (escapes \" \\ \t); returns a pointer past it. */
static const char *unquote(const char *line, char *out, size_t n) {
    const char *p = strchr(line, '"');
    if (!p) return NULL;
    size_t k = 0;
    for (p++; *p && *p != '"'; p++) {
        char c = *p;
        if (c == '\\') {
            p++;
            if (*p == 't') c = '\t';
            else if (*p == '"' || *p == '\\') c = *p;
            else return NULL;
        }
        if (k + 1 >= n) return NULL;
        out[k++] = c;
    }
    if (*p != '"') return NULL;
    out[k] = '\0';
    return p + 1;
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: t_bool TABLE\n"); return 2; }
    FILE *f = fopen(argv[1], "r");
    if (!f) { perror(argv[1]); return 2; }
    char line[512], val[256], want[32];
    int rows = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        const char *rest = unquote(line, val, sizeof val);
        if (!rest || sscanf(rest, "%31s", want) != 1) { printf("unreadable row: %s", line); bad++; continue; }
        int w = !strcmp(want, "true") ? 1 : !strcmp(want, "false") ? 0 : !strcmp(want, "invalid") ? -1 : -2;
        if (w == -2) { printf("unknown reading '%s' in row: %s", want, line); bad++; continue; }
        int got = vgpu_bool_parse(val);
        rows++;
        if (got != w) { printf("mismatch: \"%s\" want %d got %d\n", val, w, got); bad++; }
    }
    fclose(f);
    printf("rows %d mismatches %d\n", rows, bad);
    return (bad == 0 && rows > 0) ? 0 : 1;
}
