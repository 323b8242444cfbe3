typedef int pto_placeholder;
