// SPDX-License-Identifier: Apache-2.0

// Command release is `make dist`'s and `make notice`'s helper: it packs the plugins
// cross-built for each architecture into byte-reproducible tarballs with checksum
// files beside them, and writes NOTICE from the Go modules compiled into the plugins.
//
//	release pack -version V -mtime EPOCH -stage DIR -out DIR -docs LICENSE,README.md,NOTICE ARCH...
//	release notice > NOTICE
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: release pack|notice [flags]; see `make dist` and `make notice`")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "pack":
		err = packCmd(os.Args[2:])
	case "notice":
		var text string
		if text, err = Notice("."); err == nil {
			_, err = os.Stdout.WriteString(text)
		}
	default:
		err = fmt.Errorf("unknown subcommand %q: use pack or notice", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "release %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func packCmd(args []string) error {
	fs := flag.NewFlagSet("pack", flag.ContinueOnError)
	version := fs.String("version", "", "podwire version for the tarball names (make passes .ci/version's)")
	mtime := fs.String("mtime", "", "modification time of every entry, seconds since the epoch (SOURCE_DATE_EPOCH)")
	stage := fs.String("stage", "", "directory with one subdirectory of built plugins per architecture")
	out := fs.String("out", "", "directory the tarballs and checksum files go to")
	docs := fs.String("docs", "LICENSE,README.md,NOTICE", "comma-separated files added to every tarball")
	if err := fs.Parse(args); err != nil {
		return err
	}
	epoch, err := strconv.ParseInt(*mtime, 10, 64)
	if err != nil || epoch < 0 {
		return fmt.Errorf("-mtime %q is not a number of seconds since the epoch: set SOURCE_DATE_EPOCH or build from a git checkout", *mtime)
	}
	if *version == "" || *stage == "" || *out == "" || fs.NArg() == 0 {
		return fmt.Errorf("-version, -stage, -out and at least one architecture are required")
	}
	for _, arch := range fs.Args() {
		name, err := Pack(PackSpec{
			Version: *version, Arch: arch, Epoch: epoch,
			BinDir: *stage + "/" + arch, Docs: strings.Split(*docs, ","), OutDir: *out,
		})
		if err != nil {
			return err
		}
		fmt.Println(name)
	}
	return nil
}
