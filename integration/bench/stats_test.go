// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// sample is a series of durations for one (benchmark, column, operation).
type sample []time.Duration

func (s sample) quantile(q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := append(sample(nil), s...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	idx := int(q*float64(len(c)-1) + 0.5)
	return c[idx]
}

func (s sample) median() time.Duration { return s.quantile(0.5) }
func (s sample) p95() time.Duration    { return s.quantile(0.95) }

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/1e6) }

// cell renders a sample as "median / p95" in ms, or n/a when there is none.
func cell(s sample) string {
	if len(s) == 0 {
		return "n/a"
	}
	return ms(s.median()) + " / " + ms(s.p95())
}

// delta renders the difference of two medians in ms, signed.
func delta(s, base sample) string {
	if len(s) == 0 || len(base) == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%+.1f", float64(s.median()-base.median())/1e6)
}

// seMedian estimates the standard error of s's median in ns from its interquartile
// range (normal approximation: σ ≈ IQR/1.349, SE ≈ 1.2533·σ/√n).
func (s sample) seMedian() float64 {
	if len(s) < 4 {
		return math.NaN()
	}
	iqr := float64(s.quantile(0.75) - s.quantile(0.25))
	return 1.2533 * iqr / 1.349 / math.Sqrt(float64(len(s)))
}

// deltaPM is delta with the standard error of the difference of the two medians,
// "+1.4 ± 3.0": how far apart two medians on a busy machine can be by chance.
func deltaPM(s, base sample) string {
	d := delta(s, base)
	if d == "n/a" {
		return d
	}
	se := math.Hypot(s.seMedian(), base.seMedian())
	if math.IsNaN(se) {
		return d
	}
	return fmt.Sprintf("%s ± %.1f", d, se/1e6)
}

// ratio renders num's median over den's as "N.N×".
func ratio(num, den sample) string {
	if len(num) == 0 || len(den) == 0 || den.median() <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f×", float64(num.median())/float64(den.median()))
}

// fraction renders num's median over den's as a plain decimal (0.25 = a quarter).
func fraction(num, den sample) string {
	if len(num) == 0 || len(den) == 0 || den.median() <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", float64(num.median())/float64(den.median()))
}

// table is one section of BENCHMARKS.md: a heading, a markdown table and notes.
type table struct {
	name   string
	intro  string
	header []string
	rows   [][]string
	notes  []string
}

func (t *table) row(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) note(format string, a ...any) {
	n := fmt.Sprintf(format, a...)
	for _, have := range t.notes {
		if have == n {
			return
		}
	}
	t.notes = append(t.notes, n)
}

// timingHeader is the header of sections that compare the three sets on one operation
// per row.
var timingHeader = []string{"benchmark", "floor ms (median / p95)", "reference ms", "podwire ms",
	"reference − floor", "podwire − floor", "reference / podwire"}

// timingRow writes one row comparing floor, reference and podwire medians and p95s.
func (t *table) timingRow(name string, floor, ref, ours sample) {
	t.row(name, cell(floor), cell(ref), cell(ours), delta(ref, floor), delta(ours, floor), ratio(ref, ours))
}

// report is every table of one run, in order.
type report struct {
	tables []*table
}

func (r *report) section(name string, header ...string) *table {
	t := &table{name: name, header: header}
	r.tables = append(r.tables, t)
	return t
}

func (r *report) markdown(header string) string {
	var b strings.Builder
	b.WriteString(header)
	for _, t := range r.tables {
		fmt.Fprintf(&b, "\n### %s\n\n", t.name)
		if t.intro != "" {
			b.WriteString(t.intro + "\n\n")
		}
		if len(t.header) > 0 {
			b.WriteString("| " + strings.Join(t.header, " | ") + " |\n")
			b.WriteString("|" + strings.Repeat("---|", len(t.header)) + "\n")
			for _, row := range t.rows {
				b.WriteString("| " + strings.Join(row, " | ") + " |\n")
			}
		}
		if len(t.notes) > 0 {
			b.WriteString("\n")
			for _, n := range t.notes {
				b.WriteString("- " + n + "\n")
			}
		}
	}
	return b.String()
}
