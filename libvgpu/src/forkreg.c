/* forkreg.c - the one pthread_atfork child handler, running every registered reset (forkreg.h). */
#include <pthread.h>
#include "forkreg.h"

#define MAX_HANDLERS 16
static void (*handlers[MAX_HANDLERS])(void);
static int nhandlers;

static void run_child_handlers(void) {
    for (int i = 0; i < nhandlers; i++) handlers[i]();
}

void vgpu_on_fork_child(void (*fn)(void)) {
    if (nhandlers == 0) pthread_atfork(NULL, NULL, run_child_handlers);
    if (nhandlers < MAX_HANDLERS) handlers[nhandlers++] = fn;
}
