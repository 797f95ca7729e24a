package bench

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// sample is a series of durations for one (benchmark, set, operation).
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

// report accumulates the markdown table rows.
type report struct {
	sections []string
	rows     map[string][]string
	notes    []string
}

func newReport() *report { return &report{rows: map[string][]string{}} }

func (r *report) section(name string) {
	r.sections = append(r.sections, name)
}

func (r *report) row(cells ...string) {
	sec := r.sections[len(r.sections)-1]
	r.rows[sec] = append(r.rows[sec], "| "+strings.Join(cells, " | ")+" |")
}

func (r *report) note(format string, a ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, a...))
}

// timingRow writes one row comparing floor, reference and podwire medians and p95s.
func (r *report) timingRow(name string, floor, ref, ours sample) {
	cell := func(s sample) string {
		if len(s) == 0 {
			return "n/a"
		}
		return ms(s.median()) + " / " + ms(s.p95())
	}
	over := func(s sample) string {
		if len(s) == 0 || len(floor) == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%+.1f", float64(s.median()-floor.median())/1e6)
	}
	ratio := "n/a"
	if len(ref) > 0 && len(ours) > 0 && ours.median() > 0 {
		ratio = fmt.Sprintf("%.1f×", float64(ref.median())/float64(ours.median()))
	}
	r.row(name, cell(floor), cell(ref), cell(ours), over(ref), over(ours), ratio)
}

const timingHeader = "| benchmark | floor ms (median / p95) | reference ms | podwire ms | reference − floor | podwire − floor | reference / podwire |\n|---|---|---|---|---|---|---|"

func (r *report) markdown(header string) string {
	var b strings.Builder
	b.WriteString(header)
	for _, s := range r.sections {
		fmt.Fprintf(&b, "\n### %s\n\n", s)
		rows := r.rows[s]
		if len(rows) > 0 && !strings.HasPrefix(rows[0], "|---") && !strings.HasPrefix(rows[0], "| benchmark") && !strings.HasPrefix(rows[0], "| plugin") && !strings.HasPrefix(rows[0], "| case") {
			b.WriteString(timingHeader + "\n")
		}
		for _, row := range rows {
			b.WriteString(row + "\n")
		}
	}
	if len(r.notes) > 0 {
		b.WriteString("\n### Notes\n\n")
		for _, n := range r.notes {
			b.WriteString("- " + n + "\n")
		}
	}
	return b.String()
}
