// SPDX-License-Identifier: Apache-2.0

package benchmd

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "B.md")
	if err := os.WriteFile(path, []byte("# top\n\n<!-- a:begin -->\nold a\n<!-- a:end -->\ntail\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteSection(path, "a", "new a\n"); err != nil {
		t.Fatal(err)
	}
	if err := WriteSection(path, "b", "b body"); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	want := "# top\n\n<!-- a:begin -->\nnew a\n<!-- a:end -->\ntail\n\n<!-- b:begin -->\nb body\n<!-- b:end -->\n"
	if string(got) != want {
		t.Fatalf("got\n%q\nwant\n%q", got, want)
	}
	s := Sections(string(got))
	if len(s) != 2 || s[0] != "<!-- a:begin -->\nnew a\n<!-- a:end -->" || s[1] != "<!-- b:begin -->\nb body\n<!-- b:end -->" {
		t.Fatalf("sections %q", s)
	}
	// An unterminated section is not one.
	if s := Sections("<!-- c:begin -->\nno end\n"); len(s) != 0 {
		t.Fatalf("sections of an unterminated one: %q", s)
	}
}
