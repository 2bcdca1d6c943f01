// Package cputime reads the CPU time the calling thread or the whole
// process has used, for benchmarks that report it beside elapsed time: on
// a shared machine other jobs inflate elapsed time much more than the CPU
// time of the code measured.
package cputime
