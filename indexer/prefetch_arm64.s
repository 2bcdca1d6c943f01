#include "textflag.h"

// func prefetchLines2(a, b unsafe.Pointer)
TEXT ·prefetchLines2(SB), NOSPLIT|NOFRAME, $0-16
	MOVD a+0(FP), R0
	MOVD b+8(FP), R1
	PRFM (R0), PLDL1KEEP
	PRFM (R1), PLDL1KEEP
	RET

// func prefetchLines3(a, b, c unsafe.Pointer)
TEXT ·prefetchLines3(SB), NOSPLIT|NOFRAME, $0-24
	MOVD a+0(FP), R0
	MOVD b+8(FP), R1
	MOVD c+16(FP), R2
	PRFM (R0), PLDL1KEEP
	PRFM (R1), PLDL1KEEP
	PRFM (R2), PLDL1KEEP
	RET
