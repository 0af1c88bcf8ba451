"""Lets torch 1.13's DCP (torch.distributed._shard.checkpoint) import under
Python 3.11, for test and benchmark code only: one of its metadata
dataclasses has a field with a mutable default, which 3.11 refuses. Import
this module before torch.distributed._shard: such a default becomes a
default_factory, which is how newer torch declares it."""
import copy
import dataclasses

_get_field = dataclasses._get_field


def _mutable_default_as_factory(cls, name, type_, *args, **kwargs):
    default = cls.__dict__.get(name, dataclasses.MISSING)
    value = default.default if isinstance(default, dataclasses.Field) else default
    if value is not dataclasses.MISSING and value.__class__.__hash__ is None:
        setattr(cls, name, dataclasses.field(default_factory=lambda v=value: copy.deepcopy(v)))
    return _get_field(cls, name, type_, *args, **kwargs)


dataclasses._get_field = _mutable_default_as_factory
