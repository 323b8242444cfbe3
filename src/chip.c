typedef int pto_placeholder_chip;
