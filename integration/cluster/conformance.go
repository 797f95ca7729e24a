// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// The upstream specs make conformance runs: sig-network's [Conformance] ones that may
// share the cluster (the [Serial] and [Disruptive] ones are a separate pass).
const (
	ConformanceFocus = `\[sig-network\].*\[Conformance\]`
	ConformanceSkip  = `\[Disruptive\]|\[Serial\]`
)

// notHere are the specs no lab of this kind can run: behind a feature gate, for one
// cloud provider or a load balancer, or IPv6 and dual-stack (the lab is IPv4 only).
const notHere = `\[Feature:|\[FeatureGate:|\[Provider:|LoadBalancer|IPv6|[Dd]ual-?[Ss]tack`

// Pass is one e2e.test run of make conformance.
type Pass struct {
	Name, Focus, Skip string
}

// ConformancePasses are make conformance's runs, in order, per kube-proxy mode: the
// [Conformance] specs, then sig-network's [Serial] ones alone, then the rest of the
// HostPort, Services, DNS and Conntrack specs. [Disruptive] ones restart kube-proxy or the
// API server through a cloud provider's SSH: the skeleton provider cannot.
var ConformancePasses = []Pass{
	{"conformance", ConformanceFocus, ConformanceSkip},
	{"serial", `\[sig-network\].*\[Serial\]`, `\[Disruptive\]|` + notHere},
	{"extra", `\[sig-network\] (HostPort|Services|DNS|Conntrack) `, `\[Conformance\]|\[Serial\]|\[Disruptive\]|` + notHere},
}

// SpecResult is one spec of a JUnit report.
type SpecResult struct {
	Name     string
	Result   string // pass, fail or skip
	Duration time.Duration
	Message  string // the first line of a failure
}

// RunConformance runs one pass of e2e.test against the lab with kube-proxy in mode,
// writing its output and JUnit report under the run dir, and returns the specs that ran.
func RunConformance(dir, mode string, pass Pass, log io.Writer) ([]SpecResult, error) {
	p, err := SetProxyMode(dir, mode)
	if err != nil {
		return nil, err
	}
	focus, skip := pass.Focus, pass.Skip
	out := filepath.Join(p.Dir, "conformance", mode, pass.Name)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	cmd := exec.Command(p.bin("e2e.test"),
		"--kubeconfig="+p.Kubeconfig, "--kubectl-path="+p.bin("kubectl"), "--provider=skeleton",
		"--report-dir="+out, "--ginkgo.focus="+focus, "--ginkgo.skip="+skip,
		"--ginkgo.no-color", "--ginkgo.timeout=3h", "--ginkgo.v")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+p.Kubeconfig, "PATH="+p.BinDir+":"+sbinPath)
	f, err := os.Create(filepath.Join(out, "e2e.log"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	fmt.Fprintf(log, "e2e.test pass %s in kube-proxy mode %s: %s (log %s)\n", pass.Name, mode, strings.Join(cmd.Args, " "), f.Name())
	runErr := cmd.Run() // a failed spec is a non-zero exit: the report says which
	specs, err := ReadJUnit(filepath.Join(out, "junit_01.xml"))
	if err != nil {
		return nil, fmt.Errorf("%v; e2e.test: %v (see %s)", err, runErr, f.Name())
	}
	return specs, nil
}

type junit struct {
	Suites []struct {
		Cases []struct {
			Name    string  `xml:"name,attr"`
			Time    float64 `xml:"time,attr"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
			Failure *struct {
				Message string `xml:"message,attr"`
				Body    string `xml:",chardata"`
			} `xml:"failure"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// ReadJUnit reads e2e's JUnit report; specs that the focus skipped are left out, as are
// ginkgo's suite nodes.
func ReadJUnit(file string) ([]SpecResult, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("no JUnit report: %w", err)
	}
	var j junit
	if err := xml.Unmarshal(b, &j); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", file, err)
	}
	var out []SpecResult
	for _, s := range j.Suites {
		for _, c := range s.Cases {
			if strings.HasPrefix(c.Name, "[SynchronizedBeforeSuite]") || strings.HasPrefix(c.Name, "[SynchronizedAfterSuite]") ||
				strings.HasPrefix(c.Name, "[ReportBeforeSuite]") || strings.HasPrefix(c.Name, "[ReportAfterSuite]") {
				continue
			}
			r := SpecResult{Name: c.Name, Result: "pass", Duration: time.Duration(c.Time * float64(time.Second))}
			switch {
			case c.Skipped != nil && strings.Contains(c.Skipped.Message, "skipped") && c.Time == 0:
				continue // not selected by the focus
			case c.Skipped != nil:
				r.Result, r.Message = "skip", firstLine(c.Skipped.Message)
			case c.Failure != nil:
				r.Result, r.Message = "fail", firstLine(c.Failure.Message)
				if r.Message == "" {
					r.Message = failureLine(c.Failure.Body)
				}
			}
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, k int) bool { return out[i].Name < out[k].Name })
	return out, nil
}

// failureLine is the line of a ginkgo failure report that says what failed: the one
// after "[FAILED]" (the report's first lines are the spec's location).
func failureLine(body string) string {
	for _, l := range strings.Split(body, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "[FAILED] ") && !strings.HasPrefix(l, "[FAILED] in [") {
			return firstLine(strings.TrimPrefix(l, "[FAILED] "))
		}
	}
	return firstLine(body)
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// ConformanceTable renders one pass's results as a markdown table.
func ConformanceTable(mode, pass string, specs []SpecResult) string {
	var b strings.Builder
	count := map[string]int{}
	for _, s := range specs {
		count[s.Result]++
	}
	var total time.Duration
	for _, s := range specs {
		total += s.Duration
	}
	fmt.Fprintf(&b, "### kube-proxy mode %s, pass %s: %d pass, %d fail, %d skip (%s)\n\n| spec | result | duration | note |\n|---|---|---|---|\n",
		mode, pass, count["pass"], count["fail"], count["skip"], total.Round(time.Second))
	for _, s := range specs {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", strings.ReplaceAll(s.Name, "|", `\|`), s.Result,
			s.Duration.Round(100*time.Millisecond), strings.ReplaceAll(s.Message, "|", `\|`))
	}
	return b.String()
}
