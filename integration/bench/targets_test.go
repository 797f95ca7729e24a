package bench

// The targets of issue 8, checked against this run's numbers and listed first in
// BENCHMARKS.md. They are reported, never asserted: a miss is a finding for the
// plugin's owner, not a test failure.

// target adds one row to the targets table. ok is nil when the run could not decide
// (a column missing).
func (e *env) target(name, want, ours, ref string, ok *bool) {
	met := "n/a"
	if ok != nil {
		met = "yes"
		if !*ok {
			met = "**no**"
		}
	}
	e.targets.row(name, want, ours, ref, met)
}

func boolp(b bool) *bool { return &b }

// under reports whether the median of s is below limit ms over base's median (base nil:
// absolute), as a decision for target.
func under(s, base sample, limitMS float64) *bool {
	if len(s) == 0 || (base != nil && len(base) == 0) {
		return nil
	}
	v := float64(s.median())
	if base != nil {
		v -= float64(base.median())
	}
	return boolp(v/1e6 <= limitMS)
}
