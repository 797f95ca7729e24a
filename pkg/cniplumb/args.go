// SPDX-License-Identifier: Apache-2.0

package cniplumb

import (
	"reflect"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
)

// LoadArgs parses CNI_ARGS ("K1=V1;K2=V2") into args, a pointer to a struct that
// embeds types.CommonArgs and has a field per key the plugin reads, named as the key
// (MAC, IP), of a type that implements encoding.TextUnmarshaler. It is the CNI
// library's types.LoadArgs, which the reference plugins use, so podwire accepts and
// refuses exactly the same CNI_ARGS: keys are matched case-sensitively against the
// field names ("mac=" is not MAC), every entry must be one KEY=VALUE (an empty entry,
// as from a trailing ';', is refused), a value must parse into its field, and a key
// the struct lacks is refused unless IgnoreUnknown is true ("1", "true"). Runtimes pass
// keys meant for other plugins (K8S_POD_NAME...) with IgnoreUnknown=1.
//
// plugin names the plugin in the error, a code-4 error saying which keys it reads.
func LoadArgs(plugin, raw string, args any) error {
	if err := types.LoadArgs(raw, args); err != nil {
		return EnvError("CNI_ARGS", "%v (CNI_ARGS is %q); %s reads %s, matched case-sensitively, and refuses other keys unless IgnoreUnknown=1 is set",
			err, raw, plugin, strings.Join(argKeys(reflect.TypeOf(args).Elem()), ", "))
	}
	return nil
}

// argKeys lists the keys a LoadArgs struct reads: its exported fields, those of
// embedded structs (IgnoreUnknown) included.
func argKeys(t reflect.Type) []string {
	var keys []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		switch {
		case f.Anonymous && f.Type.Kind() == reflect.Struct:
			keys = append(keys, argKeys(f.Type)...)
		case f.IsExported():
			keys = append(keys, f.Name)
		}
	}
	return keys
}
