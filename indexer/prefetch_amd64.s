#include "textflag.h"

// func prefetchLines2(a, b unsafe.Pointer)
TEXT ·prefetchLines2(SB), NOSPLIT|NOFRAME, $0-16
	MOVQ a+0(FP), AX
	MOVQ b+8(FP), BX
	PREFETCHT0 (AX)
	PREFETCHT0 (BX)
	RET

// func prefetchLines3(a, b, c unsafe.Pointer)
TEXT ·prefetchLines3(SB), NOSPLIT|NOFRAME, $0-24
	MOVQ a+0(FP), AX
	MOVQ b+8(FP), BX
	MOVQ c+16(FP), CX
	PREFETCHT0 (AX)
	PREFETCHT0 (BX)
	PREFETCHT0 (CX)
	RET
