typedef int pto_placeholder_arena;
