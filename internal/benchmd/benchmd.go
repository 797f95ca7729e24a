// SPDX-License-Identifier: Apache-2.0

// Package benchmd keeps BENCHMARKS.md's sections that other make targets own: each is
// between `<!-- NAME:begin -->` and `<!-- NAME:end -->` lines, written whole by its own
// target (make bench-agent, bench-startup, ...) and carried over by the others.
package benchmd

import (
	"fmt"
	"os"
	"regexp"
	"strings"
)

var beginRE = regexp.MustCompile(`(?m)^<!-- ([a-z0-9-]+):begin -->$`)

func markers(name string) (string, string) {
	return "<!-- " + name + ":begin -->", "<!-- " + name + ":end -->"
}

// Sections returns every marked section of md, whole (markers included), in order.
func Sections(md string) []string {
	var out []string
	for _, m := range beginRE.FindAllStringSubmatchIndex(md, -1) {
		_, end := markers(md[m[2]:m[3]])
		if j := strings.Index(md[m[0]:], end); j >= 0 {
			out = append(out, md[m[0]:m[0]+j+len(end)])
		}
	}
	return out
}

// WriteSection replaces section name of the file at path with body (appending the
// section when the file has none), leaving the rest of the file as it is.
func WriteSection(path, name, body string) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	begin, end := markers(name)
	section := begin + "\n" + strings.TrimRight(body, "\n") + "\n" + end + "\n"
	s := string(old)
	if i, j := strings.Index(s, begin), strings.Index(s, end); i >= 0 && j > i {
		s = s[:i] + section + strings.TrimPrefix(s[j+len(end):], "\n")
	} else {
		s = strings.TrimRight(s, "\n") + "\n\n" + section
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
