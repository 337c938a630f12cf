/* lib_rpdep.c - librpdep.so, found only through librunpath.so's RUNPATH (lib_runpath.c). */
int rp_dep_value(void) { return 42; }
