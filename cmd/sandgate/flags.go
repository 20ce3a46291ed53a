package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/sandgate/sandgate/sshd"
)

// listFlag is a repeatable flag; each value may also hold comma-separated items.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, item := range strings.Split(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			*l = append(*l, item)
		}
	}
	return nil
}

// envName is the environment twin of a flag: --max-sessions is SANDGATE_MAX_SESSIONS.
func envName(flagName string) string {
	return "SANDGATE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyEnv sets every flag not given on the command line from its
// environment twin, if that is set.
func applyEnv(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		if v, ok := os.LookupEnv(envName(f.Name)); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s: %w", envName(f.Name), e)
			}
		}
	})
	return err
}

// startupsFlag is --ssh-max-startups: start:rate:full.
type startupsFlag sshd.Startups

func (f *startupsFlag) String() string { return sshd.Startups(*f).String() }

func (f *startupsFlag) Set(v string) error {
	m, err := sshd.ParseStartups(v)
	if err != nil {
		return err
	}
	*f = startupsFlag(m)
	return nil
}
