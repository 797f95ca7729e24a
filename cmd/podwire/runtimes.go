package main

// runtimeVerdicts says, for cniVersion v, which runtimes found on this node refuse it
// or skip GC and STATUS with it. It will read pkg/runtimes' table (w-agent).
func runtimeVerdicts(v string) []string { return nil }

// runtimeGC says whether runtime name at version ver calls GC and STATUS, from
// pkg/runtimes' table (w-agent).
func runtimeGC(name, ver string) string { return "" }
