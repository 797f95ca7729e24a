package netfilter

import (
	"strings"
	"testing"
)

// backslashEscape must do what the strings.Replacer it stands for does.
func TestBackslashEscape(t *testing.T) {
	for _, s := range []string{"", "plain", `a"b`, `a\b`, `'`, `"\'x'\"`, "naïve \"ü\" \\", "\x00\xff\""} {
		for _, tc := range []struct {
			special string
			r       *strings.Replacer
		}{
			{`"\`, strings.NewReplacer(`\`, `\\`, `"`, `\"`)},
			{`"\'`, strings.NewReplacer(`"`, `\"`, `\`, `\\`, `'`, `\'`)},
		} {
			if got, want := backslashEscape(s, tc.special), tc.r.Replace(s); got != want {
				t.Errorf("backslashEscape(%q, %q) = %q, want %q", s, tc.special, got, want)
			}
		}
	}
}
