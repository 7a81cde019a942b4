"""Py4J's class and method lookups, answered once per name instead of once per call.

Every PySpark function builds its JVM Column through Py4J, and Py4J resolves the JVM class and
then the method by name on every call before it calls it: `F.col("t")` is three round trips to
the JVM (`sc._jvm.functions`, then `.col`, then the call), and one analysis of a small run
made about 4,000 such lookups among its 12,500 round trips, 2 s of the driver's time on a
2-core machine. A class and a static method stay what they are for the JVM's life, so their
lookups are remembered here; fields are not (their values may change), nor is anything of
an object.
"""

from __future__ import annotations

from typing import Any

from py4j.java_gateway import JavaClass, JavaMember, JavaPackage, JVMView
from pyspark.sql import SparkSession


class _RememberingClass(JavaClass):
    """A JavaClass whose static methods and nested classes are looked up once."""

    def __getattr__(self, name: str) -> Any:
        known = self.__dict__.setdefault("_undertow_members", {})
        if name in known:
            return known[name]
        found = super().__getattr__(name)
        if isinstance(found, JavaMember | JavaClass):
            known[name] = _remembering(found)
        return found


class _RememberingNames:
    """Each name looked up once: a package's classes and subpackages, or the view's."""

    def __getattr__(self, name: str) -> Any:
        known = self.__dict__.setdefault("_undertow_members", {})
        if name not in known:
            known[name] = _remembering(super().__getattr__(name))  # type: ignore[misc]
        return known[name]


class _RememberingPackage(_RememberingNames, JavaPackage):
    """A JavaPackage whose classes and subpackages are looked up once."""


class _RememberingView(_RememberingNames, JVMView):
    """The gateway's JVMView, whose classes and packages are looked up once by name."""


def _remembering(found: Any) -> Any:
    if type(found) is JavaClass:
        found.__class__ = _RememberingClass
    elif type(found) is JavaPackage:
        found.__class__ = _RememberingPackage
    return found


def remember_jvm_lookups(spark: SparkSession) -> None:
    """Have the session's gateway remember its class, package and static method lookups (the
    view is the SparkContext's, shared by every session of the process)."""
    view = spark.sparkContext._jvm
    if type(view) is JVMView:
        view.__class__ = _RememberingView
